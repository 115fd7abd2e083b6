"""A bare MultiWorkerMirroredStrategy step, without hvdflow: what TensorFlow itself costs.

Two worker processes on this machine (TF_CONFIG, RING collectives, one core each) train the
digits MLP of ``training.models`` (or, with ``--model mnist_cnn``, the paper's MNIST CNN at 128
images a worker) with ``model.fit`` on in-memory images repeated (``steps_per_epoch`` steps of
``--batch`` a worker, 3 epochs) and print the steady milliseconds a step. Run it with each
profile's interpreter to see whether a gap between the profiles' distributed steps is
TensorFlow's own (BENCHMARKS.md, the current profile against the classic):

    .venv/bin/python -m studies.mwms_step
    TF_USE_LEGACY_KERAS=1 .venv-current/bin/python -m studies.mwms_step
    .venv/bin/python -m studies.mwms_step --pack-mib 32 --steps-per-execution 8
    .venv/bin/python -m studies.mwms_step --model mnist_cnn --batch 128
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

from studies._mwms_workers import start_two_workers

STEPS = {"digits_mlp": 937, "mnist_cnn": 117}  # an epoch of 60,000 images over two workers


def build_model(name: str, tf):
    """training.models' digits MLP, or the paper's MNIST CNN (the study's mnist_cnn layers)."""
    layers = tf.keras.layers
    if name == "digits_mlp":
        return tf.keras.Sequential(
            [
                layers.Input(shape=(8, 8, 1)),
                layers.Flatten(),
                layers.Dense(32, activation="relu"),
                layers.Dense(10, activation="softmax"),
            ]
        )
    return tf.keras.Sequential(
        [
            layers.Input(shape=(28, 28, 1)),
            layers.Conv2D(32, 3, activation="relu"),
            layers.Conv2D(64, 3, activation="relu"),
            layers.MaxPooling2D(2),
            layers.Dropout(0.25),
            layers.Flatten(),
            layers.Dense(128, activation="relu"),
            layers.Dropout(0.5),
            layers.Dense(10, activation="softmax"),
        ]
    )


def worker(index: int, ports: list[int], args: argparse.Namespace) -> None:
    """One worker; the first prints the figures."""
    workers = [f"127.0.0.1:{port}" for port in ports]
    task = {"type": "worker", "index": index}
    os.environ["TF_CONFIG"] = json.dumps({"cluster": {"worker": workers}, "task": task})
    import numpy as np  # noqa: PLC0415 (after TF_CONFIG, in the worker)
    import tensorflow as tf  # noqa: PLC0415

    options = tf.distribute.experimental.CommunicationOptions(
        implementation=tf.distribute.experimental.CommunicationImplementation.RING,
        bytes_per_pack=args.pack_mib << 20,
    )
    strategy = tf.distribute.MultiWorkerMirroredStrategy(communication_options=options)
    rng = np.random.default_rng(0)
    side = 8 if args.model == "digits_mlp" else 28
    x, y = rng.random((30_000, side, side, 1), dtype=np.float32), rng.integers(0, 10, 30_000)
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(args.batch * 2).repeat()
    with strategy.scope():
        model = build_model(args.model, tf)
        model.compile(
            tf.keras.optimizers.Adam(0.01),
            "sparse_categorical_crossentropy",
            steps_per_execution=args.steps_per_execution,
        )
    stamps: list[float] = []
    stamp = tf.keras.callbacks.LambdaCallback(
        on_epoch_begin=lambda *_: stamps.append(time.time()),
        on_epoch_end=lambda *_: stamps.append(time.time()),
    )
    steps = STEPS[args.model]
    model.fit(dataset, epochs=3, steps_per_epoch=steps, callbacks=[stamp], verbose=0)
    if index == 0:
        epochs = [end - begin for begin, end in zip(stamps[::2], stamps[1::2], strict=True)]
        steady_ms = 1000 * sum(epochs[1:]) / (len(epochs) - 1) / steps
        figures = {"tensorflow": tf.__version__, **vars(args), "ms_per_step": round(steady_ms, 2)}
        print(json.dumps(figures), flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=sorted(STEPS), default="digits_mlp")
    parser.add_argument("--batch", type=int, default=32, help="images a step, per worker")
    parser.add_argument("--pack-mib", type=int, default=0, help="bytes_per_pack, MiB (0: auto)")
    parser.add_argument("--steps-per-execution", type=int, default=1)
    parser.add_argument("--worker", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--ports", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker is not None:
        index, ports = args.worker, [int(port) for port in args.ports.split(",")]
        del args.worker, args.ports  # the figures print the rest of the arguments
        worker(index, ports, args)
        return 0
    return start_two_workers("studies.mwms_step", argv or sys.argv[1:])


if __name__ == "__main__":
    sys.exit(main())
