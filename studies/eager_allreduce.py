"""A MultiWorkerMirroredStrategy all-reduce of two numbers, eager against traced once, between
training steps: where the interval evaluations' 1.0 s stalls came from (BENCHMARKS.md).

Two worker processes on this machine (TF_CONFIG, one core each, no hvdflow) alternate, round
after round: a few training steps of the digits MLP (``model.fit``), then the sum of a vector
over the workers, by turns ``strategy.run(all_reduce)`` called eagerly (what
``Engine.sum_over_ranks`` did) and the same inside one ``tf.function`` traced once (what it
does now). Each worker prints how long each sum took on it:

    TF_USE_LEGACY_KERAS=1 .venv-current/bin/python -m studies.eager_allreduce
    .venv/bin/python -m studies.eager_allreduce
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

from studies._mwms_workers import start_two_workers

STALL_S = 0.9  # a sum this slow is a stall (the fast ones take a few milliseconds)


def worker(index: int, ports: list[int], rounds: int, steps: int) -> dict:
    workers = [f"127.0.0.1:{port}" for port in ports]
    task = {"type": "worker", "index": index}
    os.environ["TF_CONFIG"] = json.dumps({"cluster": {"worker": workers}, "task": task})
    import numpy as np  # noqa: PLC0415 (after TF_CONFIG, in the worker)
    import tensorflow as tf  # noqa: PLC0415

    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    sum_ = tf.distribute.ReduceOp.SUM
    device = strategy.extended.worker_devices[0]

    def eager(tensor):
        per_replica = strategy.run(
            lambda: tf.distribute.get_replica_context().all_reduce(sum_, tensor)
        )
        return strategy.experimental_local_results(per_replica)[0]

    @tf.function(input_signature=[tf.TensorSpec([None], tf.float64)])
    def traced(tensor):
        with tf.device(device):
            local = tf.identity(tensor)
        per_replica = strategy.run(
            lambda: tf.distribute.get_replica_context().all_reduce(sum_, local)
        )
        return strategy.experimental_local_results(per_replica)[0]

    rng = np.random.default_rng(0)
    x, y = rng.random((4096, 8, 8, 1), dtype=np.float32), rng.integers(0, 10, 4096)
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(64).repeat()
    with strategy.scope():
        model = tf.keras.Sequential(
            [
                tf.keras.layers.Input(shape=(8, 8, 1)),
                tf.keras.layers.Flatten(),
                tf.keras.layers.Dense(32, activation="relu"),
                tf.keras.layers.Dense(10, activation="softmax"),
            ]
        )
        model.compile(tf.keras.optimizers.Adam(0.01), "sparse_categorical_crossentropy")
    seconds: dict[str, list[float]] = {"eager": [], "traced": []}
    for turn in range(2 * rounds + 2):  # the first of each is its warm-up (tracing, groups)
        model.fit(dataset, steps_per_epoch=steps, epochs=1, verbose=0)
        kind = "eager" if turn % 2 == 0 else "traced"
        started = time.perf_counter()
        summed = (eager if kind == "eager" else traced)(
            tf.constant([1.0, float(index)], tf.float64)
        )
        assert summed.numpy().tolist() == [2.0, 1.0], summed
        seconds[kind].append(time.perf_counter() - started)
    figures = {"worker": index, "tensorflow": tf.__version__}
    for kind, times in seconds.items():
        steady = times[1:]
        figures[kind] = {
            "sums": len(steady),
            "stalls": sum(t >= STALL_S for t in steady),
            "median_ms": round(1000 * statistics.median(steady), 1),
            "max_s": round(max(steady), 3),
        }
    return figures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=20, help="sums of each kind (+1 warm-up)")
    parser.add_argument("--steps", type=int, default=4, help="training steps before each sum")
    parser.add_argument("--worker", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--ports", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker is not None:
        ports = [int(port) for port in args.ports.split(",")]
        print(json.dumps(worker(args.worker, ports, args.rounds, args.steps)), flush=True)
        return 0
    return start_two_workers("studies.eager_allreduce", argv or sys.argv[1:])


if __name__ == "__main__":
    sys.exit(main())
