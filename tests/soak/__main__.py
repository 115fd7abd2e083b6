"""``python -m tests.soak``: the long soak on the multi-host harness, as root, from the project
root; prints the table for docs/benchmarks/cluster.md ("Soak") and writes the JSON record.

    .venv/bin/python -m tests.soak --runs 25 --seed 44 --json docs/benchmarks/soak.json

The runs go through the profile of the Python that runs it; with ``--current N`` the last N go
through the current profile too, on a stack of its own (``tests.soak.phases``):

    .venv/bin/python -m tests.soak --runs 30 --current 15 --each 2 --burst 10 --burst-faces prefect

and with ``--connect N`` the last N of those reach Spark through a Spark Connect server.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

from tests.soak import report
from tests.soak.plan import AIRFLOW, FACE_OF_KIND, FAULT_KINDS, OPT_IN, PREFECT, make_plan

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
    parser.add_argument(
        "--burst-faces",
        nargs="*",
        choices=[PREFECT, AIRFLOW],
        default=[PREFECT, AIRFLOW],
        help="the orchestrators that get a burst (default: each one the runs go through)",
    )
    parser.add_argument(
        "--current",
        type=int,
        default=0,
        help="the last this many runs through the current profile, on a stack of its own "
        "(.venv-current), after the classic profile's runs and bursts",
    )
    parser.add_argument(
        "--connect",
        type=int,
        default=0,
        help="the last this many of the current profile's runs reach Spark through a Spark "
        "Connect server on the cluster (sc://), one at a time",
    )
    # The part of a plan that another profile's Python runs (tests.soak.phases).
    parser.add_argument("--phase", type=Path, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)

    from tests.cluster import netns
    from tests.soak import phases

    if (reason := netns.unavailable_reason()) is not None:
        print(f"the multi-host harness cannot run here: {reason}", file=sys.stderr)
        return 2
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="hvdflow-soak-", dir="/var/tmp"))
    if args.phase is not None:
        part = phases.run_here(phases.read_plan(args.phase), workdir, args.epochs)
        if args.json:
            phases.write_part(part, args.json)
        return 0
    kinds = args.kinds or [k for k in FAULT_KINDS if k not in OPT_IN]
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
        burst_faces=tuple(args.burst_faces),
        current=args.current,
        connect=args.connect,
    )
    started = time.time()
    parts = phases.run(plan, workdir, args.epochs)
    wall = time.time() - started
    records = [r for part in parts for r in part.records]
    idle = [c for part in parts for c in part.idle]
    print(f"\nsoak: {len(plan)} runs, seed {args.seed}, {wall / 60:.1f} min\n")
    print(report.table(records, idle))
    print()
    print(report.faces_table(records))
    summary = report.summary(records, idle)
    summary["by_profile"] = {
        part.profile: {
            "runs": len(part.records),
            "wall_s": round(part.wall_s, 1),
            "tmp_at_end": report.tmp_at_end(part.idle),
            "scoring": part.scoring,
            "airflow_scoring": part.airflow_scoring,
            "final_leftovers": part.final_leftovers,
            "harness_errors": part.harness_errors,
        }
        for part in parts
    }
    summary["missing_runs"] = sorted({p.index for p in plan} - {r.planned.index for r in records})
    print(json.dumps(summary, indent=2))
    if args.json:
        record = report.as_json(
            records,
            idle,
            {
                "seed": args.seed,
                "runs": args.runs,
                "each": args.each,
                "epochs": args.epochs,
                "wall_s": wall,
                "command": " ".join(sys.argv),
                "stack": {part.profile: part.stack for part in parts},
            },
            summary,
        )
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(record, indent=2, default=str))
    bad = (
        summary["problems"]
        or summary["missing_runs"]
        or any(part.bad() for part in parts)
        or summary["leftover_processes"]
        or summary["burst_overlaps"]
    )
    return 1 if bad or summary["failed_without_reason"] else 0


if __name__ == "__main__":
    sys.exit(main())
