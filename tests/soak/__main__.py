"""``python -m tests.soak``: the long soak on the multi-host harness, as root, from the project
root; prints the table for BENCHMARKS.md ("Soak") and writes the JSON record.

    .venv/bin/python -m tests.soak --runs 25 --seed 44 --json docs/benchmarks/soak.json
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

from tests.soak import report
from tests.soak.plan import AIRFLOW, FACE_OF_KIND, FAULT_KINDS, make_plan

EPOCHS = 8


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.soak", description=__doc__)
    parser.add_argument("--runs", type=int, default=25)
    parser.add_argument("--seed", type=int, default=44)
    parser.add_argument("--each", type=int, default=2, help="runs per fault kind, at least")
    parser.add_argument("--kinds", nargs="*", choices=list(FAULT_KINDS), default=None)
    parser.add_argument("--epochs", type=int, default=EPOCHS)
    parser.add_argument(
        "--airflow",
        type=int,
        default=None,
        help="runs through Airflow (default: a quarter, at least those whose fault strikes it)",
    )
    parser.add_argument("--workdir", type=Path, default=None)
    parser.add_argument("--json", type=Path, default=None, help="where the record goes")
    parser.add_argument("--torch", type=int, default=None, help="runs with PyTorch (a quarter)")
    parser.add_argument(
        "--burst", type=int, default=0, help="then this many runs at once through each face"
    )
    args = parser.parse_args(argv)

    from tests.cluster import netns
    from tests.cluster.spark_cluster import netns_spark_cluster
    from tests.soak.session import run_soak

    if (reason := netns.unavailable_reason()) is not None:
        print(f"the multi-host harness cannot run here: {reason}", file=sys.stderr)
        return 2
    kinds = args.kinds or list(FAULT_KINDS)
    airflow = args.airflow
    if airflow is None:
        strike_airflow = sum(FACE_OF_KIND.get(k) == AIRFLOW for k in kinds) * args.each
        airflow = max(strike_airflow, args.runs // 4)
    plan = make_plan(
        args.runs,
        args.seed,
        kinds,
        epochs=args.epochs,
        each=args.each,
        airflow=airflow,
        torch=args.runs // 4 if args.torch is None else args.torch,
        burst=args.burst,
    )
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="hvdflow-soak-", dir="/var/tmp"))
    started = time.time()
    with netns_spark_cluster(
        workdir / "cluster", workers=2, cores=1, spare=1, kind="bench", timeout_s=300
    ) as cluster:
        soak = run_soak(cluster, workdir, plan, args.epochs, score_in_airflow=True)
    wall = time.time() - started
    print(f"\nsoak: {len(plan)} runs, seed {args.seed}, {wall / 60:.1f} min\n")
    print(report.table(soak.records, soak.idle))
    summary = report.summary(soak.records, soak.idle)
    summary["scoring"] = soak.scoring
    summary["airflow_scoring"] = soak.airflow_scoring
    summary["final_leftovers"] = soak.final_leftovers
    summary["harness_errors"] = soak.harness_errors
    print(json.dumps(summary, indent=2))
    if args.json:
        record = report.as_json(
            soak.records,
            soak.idle,
            {
                "seed": args.seed,
                "runs": args.runs,
                "each": args.each,
                "epochs": args.epochs,
                "wall_s": wall,
                "command": " ".join(sys.argv),
                "stack": stack_versions(),
            },
        )
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(record, indent=2, default=str))
    bad = (
        summary["problems"]
        or soak.scoring.get("state") != "COMPLETED"
        or soak.scoring.get("problems")
        or summary["leftover_processes"]
        or soak.final_leftovers
        or soak.harness_errors
        or summary["burst_overlaps"]
        or soak.airflow_scoring.get("problems")
    )
    return 1 if bad or summary["failed_without_reason"] else 0


STACK_PACKAGES = (
    "pyspark",
    "tensorflow",
    "tensorflow-cpu",
    "torch",
    "horovod",
    "mlflow",
    "prefect",
)


def stack_versions() -> dict:
    """What the soak ran on: the profile is the environment that runs it (``.venv/bin/python``
    for the classic one, ``.venv-current/bin/python`` for the current one), cluster included."""
    from importlib.metadata import PackageNotFoundError, version

    from hvdflow.tasks.config import default_engine

    found = {"python": sys.version.split()[0], "engine": default_engine()}
    for name in STACK_PACKAGES:
        try:
            found[name] = version(name)
        except PackageNotFoundError:
            pass
    return found


if __name__ == "__main__":
    sys.exit(main())
