"""What a rank would cost if it were forked from a process that had already imported its
libraries (a "zygote"), against the fresh interpreter each rank is today (#52).

Each way runs the same rank body ROUNDS times, one at a time: Horovod initialised (one
process), a digits_mlp Keras model with Horovod's optimizer, three fixed-seed epochs on the
bundled digits, and rank 0's MLflow import. A fresh rank is ``python -m studies.rank_fork
--rank``; a forked one is a child of this process, forked after the same imports. Printed: each
child's own CPU seconds (``os.times`` read when it ends, children not included), and whether
its weights are those of the fresh ranks, bit for bit (TensorFlow used after a fork).

Run: ``.venv/bin/python -m studies.rank_fork`` (the classic profile: it needs Horovod).
"""

from __future__ import annotations

import argparse
import hashlib
import os
import statistics
import subprocess
import sys
import tempfile
import time
import traceback

ROUNDS = 3
EPOCHS = 3


def preload() -> None:
    """What a Keras rank of hvdflow's imports before training, and rank 0's MLflow."""
    import horovod.tensorflow.keras  # noqa: F401
    import mlflow  # noqa: F401
    import numpy  # noqa: F401, PLC0415 (the imports are what is measured)
    import pyarrow  # noqa: F401
    import tensorflow  # noqa: F401


def rank_body() -> str:
    """Train as a rank does, on one process; the weights' SHA-256."""
    preload()
    import horovod.tensorflow.keras as hvd
    import numpy as np  # noqa: PLC0415 (imported by preload(), measured there)
    import tensorflow as tf

    from hvdflow.training.digits import bundled_digits  # noqa: PLC0415 (lazy: NumPy)
    from hvdflow.training.models import build_model  # noqa: PLC0415 (lazy: TensorFlow)

    hvd.init()
    tf.keras.utils.set_random_seed(7)
    images, labels = bundled_digits()
    x = (np.asarray(images, dtype=np.float32) / 16.0)[..., np.newaxis]
    y = np.asarray(labels, dtype=np.int64)
    model = build_model("digits_mlp", x.shape[1:], 10)
    model.compile(
        optimizer=hvd.DistributedOptimizer(tf.keras.optimizers.SGD(0.05)),
        loss="sparse_categorical_crossentropy",
        metrics=["accuracy"],
    )
    model.fit(x, y, batch_size=32, epochs=EPOCHS, shuffle=False, verbose=0)
    digest = hashlib.sha256()
    for weights in model.get_weights():
        digest.update(np.ascontiguousarray(weights).tobytes())
    return digest.hexdigest()


def _report(path: str) -> None:
    """A fresh rank's figures: the whole process's CPU, interpreter start included."""
    digest = rank_body()
    times = os.times()
    with open(path, "w") as f:
        f.write(f"{times.user + times.system} {digest}")


def fresh(path: str) -> tuple[float, str, float]:
    started = time.perf_counter()
    subprocess.run([sys.executable, "-m", "studies.rank_fork", "--rank", path], check=True)
    wall = time.perf_counter() - started
    cpu, digest = open(path).read().split()
    return float(cpu), digest, wall


def forked(path: str) -> tuple[float, str, float]:
    started = time.perf_counter()
    pid = os.fork()
    if pid == 0:
        try:
            before = os.times()
            digest = rank_body()
            after = os.times()
            with open(path, "w") as f:
                f.write(f"{after.user + after.system - before.user - before.system} {digest}")
            code = 0
        except BaseException:  # noqa: BLE001 (a child must never return into the parent's code)
            traceback.print_exc()
            code = 1
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    wall = time.perf_counter() - started
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"forked rank failed: {status}")
    cpu, digest = open(path).read().split()
    return float(cpu), digest, wall


def main() -> None:
    parser = argparse.ArgumentParser(
        description="A rank forked from a preloaded process against a fresh interpreter."
    )
    parser.add_argument("--rank", help="run one fresh rank (internal), its figures to this file")
    args = parser.parse_args()
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    if args.rank:
        _report(args.rank)
        return
    out = os.path.join(tempfile.mkdtemp(prefix="rank-fork-"), "figures")
    fresh_runs = [fresh(out) for _ in range(ROUNDS)]
    before = os.times()
    preload()
    after = os.times()
    preload_cpu = after.user + after.system - before.user - before.system
    forked_runs = [forked(out) for _ in range(ROUNDS)]
    reference = fresh_runs[0][1]
    for name, runs in (("fresh", fresh_runs), ("forked", forked_runs)):
        cpus = [r[0] for r in runs]
        walls = [r[2] for r in runs]
        same = all(r[1] == reference for r in runs)
        print(
            f"{name:>6}: CPU-s per rank {statistics.median(cpus):.2f} "
            f"({', '.join(f'{c:.2f}' for c in cpus)}), wall s {statistics.median(walls):.2f}, "
            f"weights {'identical to the fresh ranks' if same else 'DIFFERENT'}"
        )
    saved = statistics.median(r[0] for r in fresh_runs) - statistics.median(
        r[0] for r in forked_runs
    )
    print(f"the preload in the parent: {preload_cpu:.2f} CPU-s, once")
    print(f"saved per forked rank: {saved:.2f} CPU-s")


if __name__ == "__main__":
    main()
