"""Launch overhead: HorovodRunner(np=2).run(f) against horovod.spark.run(f, num_proc=2).

Both run the same trivial ``f`` (``hvd.init()``, return the size) on one local[2] Spark session,
alternating, so that both see the same machine state. Prints each repetition and the medians.

    .venv/bin/python -m studies.launch_overhead --repeats 5
"""

from __future__ import annotations

import argparse
import logging
import os
import statistics
import sys
import time

from hvdflow.infra import HorovodRunner, LaunchOptions


def trivial():
    import horovod.tensorflow as hvd

    hvd.init()
    return hvd.size()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--np", type=int, default=2)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")

    import horovod.spark

    from hvdflow.infra.spark import get_spark  # noqa: PLC0415 (lazy: it loads Spark)

    spark = get_spark(
        f"local[{args.np}]",
        "hvdflow-bench",
        {"spark.ui.enabled": "false", "spark.ui.showConsoleProgress": "false"},
    )
    spark.sparkContext.setLogLevel("ERROR")

    def ours() -> int:
        return HorovodRunner(np=args.np, options=LaunchOptions(spark=spark)).run(trivial)

    def theirs() -> int:
        return horovod.spark.run(trivial, num_proc=args.np, verbose=0)[0]

    timings: dict[str, list[float]] = {"HorovodRunner": [], "horovod.spark.run": []}
    for i in range(args.repeats):
        for name, launch in (("HorovodRunner", ours), ("horovod.spark.run", theirs)):
            started = time.perf_counter()
            size = launch()
            took = time.perf_counter() - started
            assert size == args.np, f"{name} returned size {size}"
            timings[name].append(took)
            print(f"run {i + 1}: {name:<18} {took:6.2f} s", flush=True)
    ours_median = statistics.median(timings["HorovodRunner"])
    theirs_median = statistics.median(timings["horovod.spark.run"])
    print(f"\nmedian of {args.repeats}, np={args.np}, {spark.sparkContext.master}:")
    print(f"  HorovodRunner      {ours_median:6.2f} s")
    print(f"  horovod.spark.run  {theirs_median:6.2f} s")
    print(f"  ratio ours/theirs  {ours_median / theirs_median:6.2f}")
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
