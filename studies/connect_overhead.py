"""Spark Connect against a classic session: what reaching Spark through ``sc://`` costs a launch.

    .venv-current/bin/python -m studies.connect_overhead --rounds 3 [--pipeline]
    .venv/bin/python -m studies.connect_overhead --engine horovod \
        --client .venv-client-classic/bin/python --before /path/to/older/checkout

The same two-rank function under ``HorovodRunner(np=2)`` (``--engine``; with horovod it calls
``hvd.init()``, the rendezvous) from a client process of its own, alternating a classic
``local[2]`` session and a Connect server on ``local[2]`` started once (from ``--client``, a
thin client's Python). ``--before``: also a classic session from another checkout's ``.venv``
(its launcher as it was). Medians of: making the session, ``run()`` to the ranks' body (first
and second run), the second ``run()`` in all; ``--pipeline`` adds ``hvdflow run --np 2``.
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

CLIENT = """
import json, os, sys, time
began = time.time()
kind, url, engine = sys.argv[1:4]
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
    import os, time
    if os.environ["HVDFLOW_ENGINE"] == "horovod":
        import horovod.tensorflow as hvd
        hvd.init()
    return time.time()

runs = []
for _ in range(2):
    called = time.time()
    runner = HorovodRunner(np=2, options=LaunchOptions(engine=engine, spark=spark))
    started = runner.run(body)
    runs.append({"to_body_s": started - called, "run_s": time.time() - called})
print("RESULT " + json.dumps({"session_s": session_s, "runs": runs}), flush=True)
"""


def client(kind: str, url: str, engine: str, python: str) -> dict:
    done = subprocess.run(
        [python, "-c", CLIENT, kind.split("-")[0], url, engine],
        capture_output=True,
        text=True,
        timeout=600,
        env={k: v for k, v in os.environ.items() if k != "SPARK_REMOTE"},
    )
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith("RESULT ")]
    if done.returncode or not lines:
        raise SystemExit(f"{kind} client failed:\n{done.stderr[-3000:]}")
    return json.loads(lines[-1][len("RESULT ") :])


def pipeline(kind: str, url: str, home: Path, python: str) -> float:
    master = url if kind == "connect" else "local[2]"
    started = time.monotonic()
    done = subprocess.run(
        [python, "-m", "hvdflow.flows.cli", "run", "--np", "2"]
        + ["--spark-master", master, "--params", '{"training": {"epochs": 1}}'],
        capture_output=True,
        text=True,
        timeout=1200,
        env={**os.environ, "HVDFLOW_HOME": str(home)},
    )
    if done.returncode:
        raise SystemExit(f"hvdflow run on {kind} failed:\n{done.stdout[-3000:]}")
    return time.monotonic() - started


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--pipeline", action="store_true", help="also time `hvdflow run`")
    parser.add_argument("--engine", default="tf_collective")
    parser.add_argument("--client", default=sys.executable, help="the Connect client's Python")
    parser.add_argument("--before", type=Path, help="a checkout whose .venv runs kind 'before'")
    args = parser.parse_args(argv)
    pythons = {"classic": sys.executable, "connect": args.client}
    if args.before:
        pythons["classic-before"] = str(args.before / ".venv" / "bin" / "python")
    kinds, others = tuple(pythons), tuple(pythons)[1:]
    seen: dict[str, list[dict]] = {kind: [] for kind in kinds}
    pipelines: dict[str, list[float]] = {kind: [] for kind in kinds}
    with tempfile.TemporaryDirectory() as scratch:
        home = Path(scratch) / "home"
        with SparkConnectServer(Path(scratch) / "server") as server:
            for round_ in range(args.rounds):
                for kind in kinds if round_ % 2 == 0 else reversed(kinds):
                    seen[kind].append(client(kind, server.url, args.engine, pythons[kind]))
                    if args.pipeline:
                        pipelines[kind].append(pipeline(kind, server.url, home, pythons[kind]))
                    shown = {**seen[kind][-1], "pipeline_s": (pipelines[kind] or [None])[-1]}
                    print(f"round {round_ + 1} {kind}: {json.dumps(shown)}", file=sys.stderr)
                print(f"round {round_ + 1}/{args.rounds} done", file=sys.stderr)
        if args.pipeline:  # the services `hvdflow run` started
            down = [sys.executable, "-m", "hvdflow.flows.cli", "down"]
            subprocess.run(down, env={**os.environ, "HVDFLOW_HOME": str(home)}, check=False)

    rows = {}
    for kind, results in seen.items():
        rows[kind] = {
            "session_s": statistics.median(r["session_s"] for r in results),
            "first_to_body_s": statistics.median(r["runs"][0]["to_body_s"] for r in results),
            "second_to_body_s": statistics.median(r["runs"][1]["to_body_s"] for r in results),
            "second_run_s": statistics.median(r["runs"][1]["run_s"] for r in results),
            **({"pipeline_s": statistics.median(pipelines[kind])} if args.pipeline else {}),
        }
    print(f"{'median of ' + str(args.rounds) + ' rounds':28} {'classic':>9}", end="")
    print("".join(f" {kind:>14} ratio" for kind in others))
    for key in rows["classic"]:
        classic = rows["classic"][key]
        print(f"{key:28} {classic:9.2f}", end="")
        print("".join(f" {rows[k][key]:14.2f} {rows[k][key] / classic:5.2f}" for k in others))
    print(json.dumps(rows))


if __name__ == "__main__":
    main()
