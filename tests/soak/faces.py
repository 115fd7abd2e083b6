"""The orchestrators a soak's runs go through, behind one face each: Prefect (the deployment and
its worker) and Airflow (the pipeline DAG in a real Airflow). Each asks for a run, says whether
it is running or over, and reads its outcome as the soak's table counts it; the soak does the
rest the same way for both.

A run's id is what the training step tags its MLflow run with (``hvdflow.flow_run_id``): the
flow run's id for Prefect, ``<dag_id>/<run_id>`` for Airflow.
"""

from __future__ import annotations

import contextlib
import json
import re
from datetime import datetime
from pathlib import Path

from hvdflow.infra.launcher.errors import OUTPUT_HEADING, STACKS_HEADING
from tests.soak import stack as s

EPOCH_LINE = re.compile(r"<log>:Epoch (\d+)/(\d+)\s*$")  # its start, not its "done" line
PIPELINE_DAG = "hvdflow_pipeline"
SCORE_DAG = "hvdflow_score"
# Airflow's DAG run states -> the Prefect state type the soak's records use.
AIRFLOW_STATES = {"success": "COMPLETED", "failed": "FAILED"}


# An error's heading before the failed rank's last lines, which repeat lines already logged.
TAIL_HEADINGS = (OUTPUT_HEADING, STACKS_HEADING)


def without_error_tails(lines) -> list[str]:
    """A task log's lines less the rank lines quoted in an error (Airflow splits a logged
    error into one event a line; Prefect keeps it one record)."""
    kept, quoting = [], False
    for line in lines:
        if quoting and line.startswith("[1,"):
            continue
        quoting = line.rstrip().endswith(TAIL_HEADINGS)
        kept.append(line)
    return kept


def epochs_of(lines) -> dict:
    started = [int(m.group(1)) for line in lines if (m := EPOCH_LINE.search(line))]
    return {"epochs_begun": len(started), "epochs_recomputed": len(started) - len(set(started))}


class PrefectFace:
    name = "prefect"

    def submit(self, params: dict) -> str:
        from prefect.deployments import run_deployment

        run = run_deployment(s.PIPELINE_DEPLOYMENT, parameters={"params": params}, timeout=0)
        return str(run.id)

    def state(self, run_id: str) -> str | None:
        """ "running", "final" or "waiting"; None while the server does not answer."""
        from prefect.client.orchestration import get_client

        with contextlib.suppress(Exception):  # the server may be restarting
            with get_client(sync_client=True) as client:
                state = client.read_flow_run(run_id).state
            if state is None:
                return "waiting"
            return "final" if state.is_final() else "running" if state.is_running() else "waiting"
        return None

    def outcome(self, run_id: str) -> dict:
        """The flow run's final state and its reason's first line; its epochs as its logs
        tell."""
        from prefect.client.orchestration import get_client
        from prefect.client.schemas.filters import LogFilter, LogFilterFlowRunId

        with get_client(sync_client=True) as client:
            run = client.read_flow_run(run_id)
            logs, offset = [], 0
            while True:
                page = client.read_logs(
                    log_filter=LogFilter(flow_run_id=LogFilterFlowRunId(any_=[run_id])),
                    limit=200,
                    offset=offset,
                )
                logs += page
                offset += len(page)
                if len(page) < 200:
                    break
        message = (run.state.message or "").strip()
        return {
            "state": run.state.type.value,
            "reason": message.splitlines()[0] if message else "",
            "reason_lines": len(message.splitlines()),
            **epochs_of(log.message for log in logs),
            "ended_at": run.end_time.timestamp() if run.end_time else None,
            "seconds": (run.end_time - run.start_time).total_seconds()
            if run.end_time and run.start_time
            else None,
        }

    def cancel(self, run_id: str) -> None:
        from prefect.client.orchestration import get_client
        from prefect.states import Cancelling

        with contextlib.suppress(Exception), get_client(sync_client=True) as client:
            client.set_flow_run_state(run_id, Cancelling(), force=True)

    def log_files(self, stack) -> list[Path]:
        """The workers' logs: the flow runs' output, rank lines included."""
        return sorted(stack.workdir.glob("worker-*.log"))


class AirflowFace:
    """The pipeline DAG of the soak's Airflow (``stack.airflow``), triggered through its REST
    API with the same nested parameters as the Prefect deployment."""

    name = "airflow"

    def __init__(self, stack):
        self.stack = stack

    @property
    def airflow(self):
        return self.stack.airflow

    def submit(self, params: dict) -> str:
        self.stack.wait_for_airflow()
        run_id = self.airflow.trigger(PIPELINE_DAG, {"params": params})
        return f"{PIPELINE_DAG}/{run_id}"

    def _run(self, run_id: str) -> dict | None:
        with contextlib.suppress(Exception):  # the API server may be restarting
            return self.airflow.dag_run(*run_id.split("/", 1))
        return None

    def state(self, run_id: str) -> str | None:
        run = self._run(run_id)
        if run is None:
            return None
        if run["state"] in AIRFLOW_STATES:
            return "final"
        return "running" if run["state"] == "running" else "waiting"

    def outcome(self, run_id: str) -> dict:
        dag_id, dag_run_id = run_id.split("/", 1)
        run = self._run(run_id)
        if run is None:
            raise RuntimeError(f"Airflow does not answer for {run_id}")
        tasks = self.airflow.task_instances(dag_id, dag_run_id)
        lines: list[str] = []
        train = tasks.get("train")
        for attempt in range(1, (train or {}).get("try_number", 0) + 1):
            lines += self.airflow.task_log(dag_id, dag_run_id, "train", attempt).splitlines()
        reason = ""
        failed = [t for t in tasks.values() if t["state"] in ("failed", "upstream_failed")]
        if run["state"] == "failed":
            first = next((t for t in failed if t["state"] == "failed"), None)
            if first is not None:
                task_id, attempt = first["task_id"], first["try_number"]
                log = self.airflow.task_log(dag_id, dag_run_id, task_id, attempt)
                reason = f"{first['task_id']}: {_last_line(log)}"
            else:
                reason = f"the DAG run failed; tasks: {_states(tasks)}"
        started, ended = _when(run.get("start_date")), _when(run.get("end_date"))
        return {
            "state": AIRFLOW_STATES.get(run["state"], run["state"].upper()),
            "reason": reason,
            "reason_lines": 1 if reason else 0,
            **epochs_of(without_error_tails(lines)),
            "ended_at": ended,
            "seconds": ended - started if started and ended else None,
            "train_tries": (train or {}).get("try_number", 0),
            "tasks": _states(tasks),
        }

    def cancel(self, run_id: str) -> None:
        from tests.airflow_harness import quote

        dag_id, dag_run_id = run_id.split("/", 1)
        with contextlib.suppress(Exception):
            self.airflow.request(
                "PATCH", f"/api/v2/dags/{dag_id}/dagRuns/{quote(dag_run_id)}", {"state": "failed"}
            )

    def log_files(self, stack) -> list[Path]:
        """The train tasks' logs, one file an attempt, each line a JSON event."""
        if stack.airflow is None:
            return []
        return sorted((stack.airflow.home / "logs").glob("dag_id=*/run_id=*/task_id=train/*.log"))


def log_line(path: Path, line: str) -> str:
    """A log file's line as text: Airflow's task logs are JSON events."""
    if "task_id=" in str(path) and line.startswith("{"):
        with contextlib.suppress(ValueError):
            return str(json.loads(line).get("event", ""))
    return line


def _last_line(log: str) -> str:
    lines = [ln.strip() for ln in log.splitlines() if ln.strip()]
    return lines[-1] if lines else ""


def _states(tasks: dict[str, dict]) -> dict[str, str]:
    return {task_id: str(t["state"]) for task_id, t in tasks.items()}


def _when(value: str | None) -> float | None:
    return datetime.fromisoformat(value).timestamp() if value else None
