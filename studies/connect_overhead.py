"""Spark Connect against a classic session: what reaching Spark through ``sc://`` costs a launch.

    .venv-current/bin/python -m studies.connect_overhead --rounds 3 [--pipeline]

The same two-rank function under ``HorovodRunner(np=2)`` (tf_collective) from a client process
of its own, alternating a classic ``local[2]`` session and a Connect server on ``local[2]``
started once. Medians of: making the session, ``run()`` to the ranks' body (first and second
run), the second ``run()`` in all; ``--pipeline`` adds ``hvdflow run --np 2`` on each.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from hvdflow.infra.services.spark_connect import SparkConnectServer

KINDS = ("classic", "connect")

CLIENT = """
import json, os, sys, time
began = time.time()
kind, url = sys.argv[1], sys.argv[2]
if kind == "connect":
    from pyspark.sql import SparkSession
    spark = SparkSession.builder.remote(url).getOrCreate()
else:
    from hvdflow.infra.spark import get_spark
    spark = get_spark("local[2]", "connect-overhead", {"spark.ui.enabled": "false"})
spark.range(1).collect()
session_s = time.time() - began
from hvdflow import HorovodRunner, LaunchOptions

def body():
    import time
    return time.time()

runs = []
for _ in range(2):
    called = time.time()
    runner = HorovodRunner(np=2, options=LaunchOptions(engine="tf_collective", spark=spark))
    started = runner.run(body)
    runs.append({"to_body_s": started - called, "run_s": time.time() - called})
print("RESULT " + json.dumps({"session_s": session_s, "runs": runs}), flush=True)
"""


def client(kind: str, url: str) -> dict:
    done = subprocess.run(
        [sys.executable, "-c", CLIENT, kind, url],
        capture_output=True,
        text=True,
        timeout=600,
        env={k: v for k, v in os.environ.items() if k != "SPARK_REMOTE"},
    )
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith("RESULT ")]
    if done.returncode or not lines:
        raise SystemExit(f"{kind} client failed:\n{done.stderr[-3000:]}")
    return json.loads(lines[-1][len("RESULT ") :])


def pipeline(kind: str, url: str, home: Path) -> float:
    master = url if kind == "connect" else "local[2]"
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "hvdflow.flows.cli", "run", "--np", "2"]
        + ["--spark-master", master, "--params", '{"training": {"epochs": 1}}'],
        capture_output=True,
        text=True,
        timeout=1200,
        env={**os.environ, "HVDFLOW_HOME": str(home)},
    )
    if done.returncode:
        raise SystemExit(f"hvdflow run on {kind} failed:\n{done.stdout[-3000:]}")
    return time.monotonic() - started


def median(values) -> float:
    return statistics.median(values)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--pipeline", action="store_true", help="also time `hvdflow run`")
    args = parser.parse_args(argv)
    seen: dict[str, list[dict]] = {kind: [] for kind in KINDS}
    pipelines: dict[str, list[float]] = {kind: [] for kind in KINDS}
    with tempfile.TemporaryDirectory() as scratch:
        home = Path(scratch) / "home"
        with SparkConnectServer(Path(scratch) / "server") as server:
            for round_ in range(args.rounds):
                for kind in KINDS if round_ % 2 == 0 else reversed(KINDS):
                    seen[kind].append(client(kind, server.url))
                    if args.pipeline:
                        pipelines[kind].append(pipeline(kind, server.url, home))
                    shown = {**seen[kind][-1], "pipeline_s": (pipelines[kind] or [None])[-1]}
                    print(f"round {round_ + 1} {kind}: {json.dumps(shown)}", file=sys.stderr)
                print(f"round {round_ + 1}/{args.rounds} done", file=sys.stderr)
        if args.pipeline:
            subprocess.run(
                [sys.executable, "-m", "hvdflow.flows.cli", "down"],
                env={**os.environ, "HVDFLOW_HOME": str(home)},
                capture_output=True,
                check=False,
            )

    rows = {}
    for kind in KINDS:
        results = seen[kind]
        rows[kind] = {
            "session_s": median(r["session_s"] for r in results),
            "first_to_body_s": median(r["runs"][0]["to_body_s"] for r in results),
            "second_to_body_s": median(r["runs"][1]["to_body_s"] for r in results),
            "second_run_s": median(r["runs"][1]["run_s"] for r in results),
        }
        if args.pipeline:
            rows[kind]["pipeline_s"] = median(pipelines[kind])
    print(f"{'median of ' + str(args.rounds) + ' rounds':28} {'classic':>9} {'connect':>9} ratio")
    for key in rows["classic"]:
        classic, connect = rows["classic"][key], rows["connect"][key]
        print(f"{key:28} {classic:9.2f} {connect:9.2f} {connect / classic:5.2f}")
    print(json.dumps(rows))


if __name__ == "__main__":
    main()
