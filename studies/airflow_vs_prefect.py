"""What Airflow costs against Prefect: the same pipeline at np=2 run through each, side by side.

    .venv/bin/python -m studies.airflow_vs_prefect --rounds 3 --epochs 3 [--out FILE]

Embedded services in a temporary HVDFLOW_HOME and an Airflow from ``--airflow-venv`` (the tests'
harness, ``tests/airflow_harness.py``). Each round, in alternating order: the Prefect flow in
this process, in a fresh process (as a deployment's worker runs it) and the Airflow DAG over its
REST API. Prints the medians of wall clock, training and the rest, and Airflow's ratios.
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
from datetime import datetime
from pathlib import Path

from hvdflow.infra.services.local import LocalServices
from tests.airflow_harness import LocalAirflow

PIPELINE, SCORE = "hvdflow_pipeline", "hvdflow_score"


def _seconds(start: str, end: str) -> float:
    return (datetime.fromisoformat(end) - datetime.fromisoformat(start)).total_seconds()


def through_prefect(pipeline, params) -> dict:
    """The flow in this process: its imports and Spark session warm from the runs before."""
    started = time.monotonic()
    summary = pipeline(params)
    wall = time.monotonic() - started
    return {"wall_s": wall, "training_s": summary["wall_clock_s"]}


# A flow run in a fresh Python, as a deployment's worker starts one: imports, a new JVM.
COLD_RUN = """
import json, sys
from hvdflow.flows.params import PipelineParams
from hvdflow.flows.prefect.pipeline import pipeline
summary = pipeline(PipelineParams.model_validate(json.loads(sys.argv[1])))
print("HVDFLOW-BENCH " + json.dumps({"training_s": summary["wall_clock_s"]}))
"""


def through_prefect_process(params) -> dict:
    """The flow in a fresh process (a deployment's flow run pays the same start-up)."""
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-c", COLD_RUN, params.model_dump_json()],
        capture_output=True,
        text=True,
        timeout=900,
    )
    wall = time.monotonic() - started
    line = next((ln for ln in done.stdout.splitlines() if ln.startswith("HVDFLOW-BENCH ")), None)
    if done.returncode != 0 or line is None:
        raise RuntimeError(f"the Prefect flow in a fresh process failed: {done.stderr[-2000:]}")
    return {"wall_s": wall, **json.loads(line.removeprefix("HVDFLOW-BENCH "))}


def through_airflow(airflow: LocalAirflow, form: dict) -> dict:
    started = time.monotonic()
    run_id = airflow.trigger(PIPELINE, form)
    run = airflow.wait_for_run(PIPELINE, run_id, 900)
    wall = time.monotonic() - started
    if run["state"] != "success":
        raise RuntimeError(f"{PIPELINE} run {run_id}: {airflow.task_states(PIPELINE, run_id)}")
    tasks = airflow.task_instances(PIPELINE, run_id)
    return {
        "wall_s": wall,
        "training_s": airflow.xcom(PIPELINE, run_id, "train")["wall_clock_s"],
        "tasks_s": sum(_seconds(t["start_date"], t["end_date"]) for t in tasks.values()),
        "task_s": {k: round(_seconds(t["start_date"], t["end_date"]), 2) for k, t in tasks.items()},
    }


SIDES = {
    "prefect": "Prefect, this process",
    "prefect_process": "Prefect, a fresh process",
    "airflow": "Airflow DAG",
}


def table(runs: dict[str, list[dict]]) -> str:
    """Medians per side, and Airflow's over each Prefect side's."""
    sides = [side for side in SIDES if runs.get(side)]

    def median(side: str, key: str) -> float:
        return statistics.median(r[key] for r in runs[side])

    def rest(side: str) -> float:
        return median(side, "wall_s") - median(side, "training_s")

    prefects = [side for side in sides if side != "airflow"]
    head = " | ".join(SIDES[side] for side in sides)
    ratios = " | ".join(f"Airflow / {SIDES[side]}" for side in prefects)
    lines = [f"| | {head} | {ratios} |", "|---" * (1 + len(sides) + len(prefects)) + "|"]
    rows = (
        ("wall clock, call to end (median, s)", lambda side: median(side, "wall_s")),
        ("training (median, s)", lambda side: median(side, "training_s")),
        ("the rest: orchestration, steps (s)", rest),
    )
    for label, value in rows:
        cells = " | ".join(f"{value(side):.1f}" for side in sides)
        shares = " | ".join(f"{value('airflow') / value(side):.2f}x" for side in prefects)
        lines.append(f"| {label} | {cells} | {shares} |")
    gaps = statistics.median(r["wall_s"] - r["tasks_s"] for r in runs["airflow"])
    blanks = " | ".join("" for _ in sides[:-1])
    lines.append(f"| Airflow: between tasks (s) | {blanks} | {gaps:.1f} |{' |' * len(prefects)}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--airflow-venv", type=Path, default=Path(".venv-airflow"))
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--out", type=Path, help="write the runs and the table as JSON here")
    args = parser.parse_args(argv)
    command = args.airflow_venv.resolve() / "bin" / "airflow"
    if not command.exists():
        parser.error(f"no Airflow at {command}: run `scripts/setup.sh airflow`")

    home = Path(tempfile.mkdtemp(prefix="hvdflow-airflow-bench-"))
    os.environ["HVDFLOW_HOME"] = str(home)
    services = LocalServices(home)
    airflow = None
    try:
        os.environ.update(services.up())
        airflow = LocalAirflow(
            home / "airflow",
            {"HVDFLOW_PYTHON": sys.executable, "SPARK_LOCAL_IP": "127.0.0.1"},
            command,
        )
        airflow.write_example_dags()
        airflow.start()
        airflow.wait_for_dag(PIPELINE)
        airflow.wait_for_dag(SCORE)
        # Scoring would start on every new champion and share the machine with the next run.
        airflow.request("PATCH", f"/api/v2/dags/{SCORE}", {"is_paused": True})
        # Prefect reads its settings (the API's URL) when first imported: after services.up().
        from hvdflow.flows.params import PipelineParams  # noqa: PLC0415
        from hvdflow.flows.prefect.pipeline import pipeline  # noqa: PLC0415

        form = {"np": 2, "epochs": args.epochs}
        params = PipelineParams.model_validate(
            {"launcher": {"np": 2}, "training": {"epochs": args.epochs}}
        )
        through_prefect(pipeline, params)  # makes the dataset the measured runs reuse
        runs: dict[str, list[dict]] = {side: [] for side in SIDES}
        measure = {
            "prefect": lambda: through_prefect(pipeline, params),
            "prefect_process": lambda: through_prefect_process(params),
            "airflow": lambda: through_airflow(airflow, form),
        }
        for round_ in range(args.rounds):
            order = list(SIDES) if round_ % 2 == 0 else list(reversed(SIDES))
            for side in order:
                run = measure[side]()
                runs[side].append(run)
                print(json.dumps({"round": round_, "side": side, **run}), flush=True)  # noqa: T201
    finally:
        left = airflow.stop() if airflow else []
        services.down()
    text = table(runs)
    print(text)  # noqa: T201 (a benchmark's output)
    if left:
        print(f"Airflow processes left running: {left}")  # noqa: T201
    if args.out:
        args.out.write_text(json.dumps({"runs": runs, "table": text}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
