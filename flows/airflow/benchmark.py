"""What Airflow costs against Prefect: the same pipeline run through each, side by side.

``python -m hvdflow.flows.airflow.benchmark [--airflow-venv .venv-airflow] [--rounds 3]
[--epochs 3] [--out FILE]``

Starts the embedded services (SeaweedFS, MLflow, Prefect) in a temporary HVDFLOW_HOME and an
Airflow from ``--airflow-venv`` (``scripts/setup.sh airflow``) with the example DAG file. One
pipeline run through Prefect first makes the dataset, which every measured run then reuses. Each
round runs the pipeline at np=2 through the Prefect flow (in this process, as ``hvdflow run``
does) and through the Airflow DAG (triggered over its REST API), in alternating order. For each:
the wall clock from the call (the trigger) to the end, the training's own wall clock (the
launcher's, from the same code in both), and what is left, the orchestration's cost. For Airflow,
also the tasks' summed run time, so the time between tasks (the scheduler's) shows. Prints a
markdown table and the ratios, Airflow's over Prefect's.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

from hvdflow.bench.airflow_local import LocalAirflow, quote
from hvdflow.infra.services.local import LocalServices

PIPELINE, SCORE = "hvdflow_pipeline", "hvdflow_score"


def _seconds(start: str, end: str) -> float:
    return (datetime.fromisoformat(end) - datetime.fromisoformat(start)).total_seconds()


def through_prefect(pipeline, params) -> dict:
    started = time.monotonic()
    summary = pipeline(params)
    wall = time.monotonic() - started
    return {"wall_s": wall, "training_s": summary["wall_clock_s"]}


def through_airflow(airflow: LocalAirflow, form: dict) -> dict:
    started = time.monotonic()
    run_id = airflow.trigger(PIPELINE, form)
    run = airflow.wait_for_run(PIPELINE, run_id, 900)
    wall = time.monotonic() - started
    if run["state"] != "success":
        raise RuntimeError(f"{PIPELINE} run {run_id}: {airflow.task_states(PIPELINE, run_id)}")
    found = airflow.get(f"/api/v2/dags/{PIPELINE}/dagRuns/{quote(run_id)}/taskInstances")
    tasks = {t["task_id"]: t for t in found["task_instances"]}
    return {
        "wall_s": wall,
        "training_s": airflow.xcom(PIPELINE, run_id, "train")["wall_clock_s"],
        "tasks_s": sum(_seconds(t["start_date"], t["end_date"]) for t in tasks.values()),
        "task_s": {k: round(_seconds(t["start_date"], t["end_date"]), 2) for k, t in tasks.items()},
    }


def table(runs: dict[str, list[dict]]) -> str:
    def median(side: str, key: str) -> float:
        return statistics.median(r[key] for r in runs[side])

    lines = [
        "| | Prefect flow | Airflow DAG | Airflow / Prefect |",
        "|---|---|---|---|",
    ]
    for key, label in (("wall_s", "wall clock, call to end"), ("training_s", "training")):
        p, a = median("prefect", key), median("airflow", key)
        lines.append(f"| {label} (median, s) | {p:.1f} | {a:.1f} | {a / p:.2f}x |")
    p = median("prefect", "wall_s") - median("prefect", "training_s")
    a = median("airflow", "wall_s") - median("airflow", "training_s")
    lines.append(f"| the rest: orchestration, steps (s) | {p:.1f} | {a:.1f} | {a / p:.2f}x |")
    gaps = statistics.median(r["wall_s"] - r["tasks_s"] for r in runs["airflow"])
    lines.append(f"| Airflow: between tasks (s) | | {gaps:.1f} | |")
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
        from hvdflow.flows.pipeline import pipeline  # noqa: PLC0415

        form = {"np": 2, "epochs": args.epochs}
        params = PipelineParams.model_validate(
            {"launcher": {"np": 2}, "training": {"epochs": args.epochs}}
        )
        through_prefect(pipeline, params)  # makes the dataset the measured runs reuse
        runs: dict[str, list[dict]] = {"prefect": [], "airflow": []}
        for round_ in range(args.rounds):
            order = ("prefect", "airflow") if round_ % 2 == 0 else ("airflow", "prefect")
            for side in order:
                run = (
                    through_prefect(pipeline, params)
                    if side == "prefect"
                    else through_airflow(airflow, form)
                )
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
