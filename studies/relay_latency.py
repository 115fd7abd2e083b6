"""The object store relay against the direct channel: how late a rank's lines reach the driver.

    .venv/bin/python -m studies.relay_latency --rounds 3 --seconds 10

A two-rank function (``HorovodRunner(np=2)``, tf_collective, ``local[2]``) prints a line every
0.1 s, alternating ``relay="never"`` and ``relay="always"`` (an embedded SeaweedFS). Per mode:
median, 95th percentile and worst lateness, and the median run.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import cloudpickle

from hvdflow import HorovodRunner, LaunchOptions
from hvdflow.infra._env import temporary_env
from hvdflow.infra.services.seaweed import SeaweedServer
from hvdflow.infra.spark import get_spark
from hvdflow.infra.storage.object_store import ObjectStore, ObjectStoreConfig

# The ranks get ``chatty`` by value: they need not import this module.
cloudpickle.register_pickle_by_value(sys.modules[__name__])

MODES = ("never", "always")


def chatty(seconds: float) -> int:
    import time  # noqa: PLC0415 (in the rank)

    lines = 0
    deadline = time.time() + seconds
    while time.time() < deadline:
        print(f"line {lines}", flush=True)
        lines += 1
        time.sleep(0.1)
    return lines


def one_run(spark, mode: str, seconds: float) -> tuple[list[float], float]:
    late: list[float] = []

    def arrived(line) -> None:
        if line.text.startswith("line "):
            late.append(time.time() - line.time)

    options = LaunchOptions(spark=spark, engine="tf_collective", relay=mode, on_log_line=arrived)
    started = time.monotonic()
    HorovodRunner(np=2, options=options).run(chatty, seconds=seconds)
    return late, time.monotonic() - started


def percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(share * len(ordered)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=10.0)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        server = SeaweedServer(Path(tmp) / "s3").start()
        try:
            with temporary_env({**server.env(), "HVDFLOW_BUCKET": "relay-study"}):
                ObjectStore(ObjectStoreConfig.from_env()).ensure_bucket()
                spark = get_spark("local[2]", "relay-latency", {"spark.ui.enabled": "false"})
                one_run(spark, "never", 1.0)  # Spark's Python workers started once, for both
                late: dict[str, list[float]] = {mode: [] for mode in MODES}
                runs: dict[str, list[float]] = {mode: [] for mode in MODES}
                for round_ in range(args.rounds):
                    for mode in MODES if round_ % 2 == 0 else reversed(MODES):
                        lines, run_s = one_run(spark, mode, args.seconds)
                        late[mode] += lines
                        runs[mode].append(run_s)
                        print(f"round {round_ + 1} {mode:6}: {len(lines)} lines, {run_s:.1f} s")
                spark.stop()
        finally:
            server.stop()
    print(f"\n{'relay':8}{'lines':>7}{'median s':>10}{'p95 s':>8}{'worst s':>9}{'run s':>8}")
    for mode in MODES:
        values = late[mode]
        print(
            f"{mode:8}{len(values):>7}{statistics.median(values):>10.3f}"
            f"{percentile(values, 0.95):>8.3f}{max(values):>9.3f}"
            f"{statistics.median(runs[mode]):>8.1f}"
        )
    ratio = statistics.median(runs["always"]) / statistics.median(runs["never"])
    print(f"run time, relay against direct: {ratio:.2f}x")


if __name__ == "__main__":
    main()
