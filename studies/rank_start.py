"""A rank's start on a session hvdflow made: forked from its task, whose pyspark daemon imported
TensorFlow once (``infra/launcher/_rank_fork.py``), against a new interpreter, side by side.

One ``local[2]`` session, HorovodRunner np=2, the two ways alternating: a variable of the
study's own in the ranks' ``extra_env`` (one that could be read at import) makes the launcher
start new interpreters, as it did before the fork. Each launch runs ``train_digits`` for one
epoch, from a fixed seed. Printed per launch: its wall time, each rank's own CPU seconds at
its end (``os.times``, children not included), and whether the weights of every launch are the
same, bit for bit. A first launch of each way is not counted (the daemon starts then).

With ``--on-driver``: np=-2, the ranks on the driver, forked from its fork server
(``infra/launcher/_fork_server.py``) against new interpreters, the same way; no Spark session.
Not counted there: the driver's first run (its ranks are new interpreters) and its second (the
fork server starts).

Run: ``.venv/bin/python -m studies.rank_start [--repeats 5] [--on-driver]`` (the classic
profile: Horovod).
"""

from __future__ import annotations

import argparse
import statistics
import time

from hvdflow import HorovodOptions, HorovodRunner, LaunchOptions

# A name the launcher does not know to be read after import: its ranks start as new interpreters.
NEW_INTERPRETER = {"RANK_START_STUDY": "1"}


def rank() -> dict:
    """One rank: what it found loaded, then the digits trained for an epoch from a seed."""
    import os  # noqa: PLC0415 (a rank's imports are what is measured)
    import sys  # noqa: PLC0415

    found = "tensorflow" in sys.modules
    import horovod.tensorflow as hvd
    import tensorflow as tf

    from hvdflow.training.smoke import train_digits  # noqa: PLC0415

    tf.keras.utils.set_random_seed(7)
    result = train_digits(epochs=1)
    times = os.times()
    result["cpu"] = list(hvd.allgather_object(times.user + times.system))
    result["found"] = list(hvd.allgather_object(found))
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--on-driver", action="store_true", help="np=-2: ranks on the driver")
    args = parser.parse_args(argv)

    spark = None
    if not args.on_driver:
        from hvdflow.infra.spark import get_spark  # noqa: PLC0415 (lazy: it loads Spark)

        spark = get_spark("local[2]", "rank-start-study")

    def launch(extra_env: dict) -> tuple[float, dict]:
        options = LaunchOptions(spark=spark, horovod=HorovodOptions(extra_env=extra_env))
        started = time.perf_counter()
        result = HorovodRunner(np=-2 if args.on_driver else 2, options=options).run(rank)
        return time.perf_counter() - started, result

    ways = {"forked": {}, "new interpreter": NEW_INTERPRETER}
    # Not counted: the daemon and the first workers start here (on the driver: its first run,
    # then the fork server's start).
    for extra_env in [{}, *ways.values()]:
        launch(extra_env)
    walls: dict[str, list[float]] = {way: [] for way in ways}
    cpus: dict[str, list[float]] = {way: [] for way in ways}
    checksums = set()
    print("| launch | way | wall s | rank CPU-s (0, 1) | TensorFlow loaded at start |")
    print("|---|---|---|---|---|")
    for i in range(args.repeats):
        for way, extra_env in ways.items():
            wall, result = launch(extra_env)
            walls[way].append(wall)
            cpus[way].extend(result["cpu"])
            checksums.update(result["checksums"])
            cpu = ", ".join(f"{c:.2f}" for c in result["cpu"])
            print(f"| {i + 1} | {way} | {wall:.2f} | {cpu} | {result['found']} |", flush=True)
    forked, new = (statistics.median(walls[w]) for w in ways)
    forked_cpu, new_cpu = (statistics.median(cpus[w]) for w in ways)
    print(f"\nmedian wall: forked {forked:.2f} s, new interpreter {new:.2f} s; ", end="")
    print(f"ratio {forked / new:.2f}")
    print(
        f"median rank CPU: forked {forked_cpu:.2f} s, new interpreter {new_cpu:.2f} s; "
        f"ratio {forked_cpu / new_cpu:.2f}"
    )
    print(f"weights identical across every launch: {len(checksums) == 1}")
    if spark is not None:
        spark.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
