"""A throwaway Airflow on this machine, for the tests, the soak and the Airflow-against-Prefect
study: its API server, scheduler and DAG processor, started on loopback from an Airflow
environment (``.venv-airflow``, which ``make test-classic`` sets up with ``scripts/setup.sh
airflow``) with a SQLite database of its own, as Airflow's docs set up a single machine; stopped
with every process they started (the LocalExecutor's workers, the tasks, hvdflow's Pythons and
their JVMs). Its REST API (v2) is what a user's scripts call.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import signal
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import psutil

from hvdflow.infra.services._process import (
    free_port,
    group_members,
    start_process,
    stop_process_group,
    wait_until_ready,
)
from tests.helpers import skip_here_fail_in_ci

COMPONENTS = ("api-server", "scheduler", "dag-processor")
START_TIMEOUT_S = 120.0
STOP_TIMEOUT_S = 20.0


class LocalAirflow:
    """Airflow 3 on 127.0.0.1:<free port>, home ``home``, run by ``command`` (the ``airflow``
    of an Airflow environment); ``env``: what its tasks see besides (the services' variables,
    HVDFLOW_PYTHON)."""

    def __init__(self, home: Path, env: dict[str, str], command: Path):
        self.command = Path(command)
        self.home = Path(home)
        self.dags_folder = self.home / "dags"
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.env = {
            **os.environ,
            **env,
            "AIRFLOW_HOME": str(self.home),
            "AIRFLOW__CORE__DAGS_FOLDER": str(self.dags_folder),
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
            "AIRFLOW__CORE__EXECUTOR": "LocalExecutor",
            "AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION": "False",
            # One user, admin, no login page: the REST API's token and the UI need no password.
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS": "True",
            "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"{self.url}/execution/",
            "AIRFLOW__API__BASE_URL": self.url,
            "AIRFLOW__API__HOST": "127.0.0.1",
            "AIRFLOW__API__WORKERS": "1",
            "AIRFLOW__API_AUTH__JWT_SECRET": secrets.token_hex(16),
            "AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL": "5",
            "AIRFLOW__SCHEDULER__SCHEDULER_HEARTBEAT_SEC": "2",
            "AIRFLOW__CORE__PARALLELISM": "4",
            # The scheduler's log server, on a port of its own: on the default 8793, a second
            # Airflow on this machine (another's, or two of these at once) found it taken.
            "AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT": str(free_port(avoid={self.port})),
        }
        # The checkout's Python path must not leak into Airflow's interpreter.
        self.env.pop("PYTHONPATH", None)
        self.processes: dict[str, subprocess.Popen] = {}
        self._token: str | None = None

    def start(self) -> LocalAirflow:
        self.dags_folder.mkdir(parents=True, exist_ok=True)
        subprocess.run(
            [str(self.command), "db", "migrate"],
            env=self.env,
            cwd=self.home,
            check=True,
            capture_output=True,
            timeout=180,
        )
        for component in COMPONENTS:
            self.start_component(component)
        try:
            self.wait_healthy()
        except BaseException:
            self.stop()
            raise
        return self

    def start_component(self, component: str) -> None:
        """Start one of COMPONENTS, in its own process group (its executor's workers and the
        tasks they run join it)."""
        extra = ["--port", str(self.port)] if component == "api-server" else []
        self.processes[component] = start_process(
            [str(self.command), component, *extra],
            self.home / f"{component}.log",
            self.env,
            cwd=self.home,
        )

    def kill_component(self, component: str) -> int:
        """SIGKILL a component's whole process group, as a crashed container or an OOM-killed
        service unit takes its children with it; how many processes it held."""
        process = self.processes[component]
        members = [process.pid, *group_members(process.pid)]
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait(10)
        deadline = time.monotonic() + 10
        while group_members(process.pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        return len(set(members))

    def wait_healthy(self) -> None:
        wait_until_ready(
            self.processes["api-server"],
            self._healthy,
            what=f"Airflow at {self.url}",
            timeout_s=START_TIMEOUT_S,
            setting="tests.airflow_harness.START_TIMEOUT_S",
            log_path=self.home / "api-server.log",
            interval_s=1.0,
        )

    def _healthy(self) -> bool:
        health = self.get("/api/v2/monitor/health", auth=False)
        return all(
            (health.get(part) or {}).get("status") == "healthy"
            for part in ("metadatabase", "scheduler", "dag_processor")
        )

    def stop(self) -> list[str]:
        """Stop every component's process group; what is still running of this Airflow after
        (any process whose environment names this AIRFLOW_HOME), which should be nothing."""
        for process in self.processes.values():
            stop_process_group(process, STOP_TIMEOUT_S)
        return self.leftovers()

    def leftovers(self) -> list[str]:
        found = []
        for process in psutil.process_iter(["pid", "name"]):
            try:
                if process.environ().get("AIRFLOW_HOME") == str(self.home):
                    found.append(f"{process.info['name']} (pid {process.info['pid']})")
            except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                continue
        return found

    # --- the REST API (v2) ----------------------------------------------------------------

    def token(self) -> str:
        if self._token is None:
            self._token = self.get("/auth/token", auth=False)["access_token"]
        return self._token

    def request(self, method: str, path: str, body: dict | None = None, *, auth: bool = True):
        headers = {"Content-Type": "application/json"}
        if auth:
            headers["Authorization"] = f"Bearer {self.token()}"
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(self.url + path, data, headers, method=method)
        with urllib.request.urlopen(request, timeout=30) as response:
            return json.loads(response.read() or b"null")

    def get(self, path: str, *, auth: bool = True):
        return self.request("GET", path, auth=auth)

    def wait_for_dag(self, dag_id: str, timeout_s: float = 90.0) -> dict:
        """The DAG once the DAG processor has parsed it; its import errors if it never is."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                return self.get(f"/api/v2/dags/{dag_id}")
            except urllib.error.HTTPError as e:
                if e.code != 404:
                    raise
            time.sleep(1)
        errors = self.get("/api/v2/importErrors")
        raise AssertionError(f"DAG {dag_id} never parsed; import errors: {errors}")

    def trigger(self, dag_id: str, conf: dict) -> str:
        run = self.request(
            "POST", f"/api/v2/dags/{dag_id}/dagRuns", {"logical_date": None, "conf": conf}
        )
        return run["dag_run_id"]

    def dag_run(self, dag_id: str, run_id: str) -> dict:
        return self.get(f"/api/v2/dags/{dag_id}/dagRuns/{quote(run_id)}")

    def task_instances(self, dag_id: str, run_id: str) -> dict[str, dict]:
        """The run's task instances by task id (state, try_number, ...)."""
        found = self.get(f"/api/v2/dags/{dag_id}/dagRuns/{quote(run_id)}/taskInstances")
        return {ti["task_id"]: ti for ti in found["task_instances"]}

    def wait_for_run(self, dag_id: str, run_id: str, timeout_s: float) -> dict:
        """The DAG run once it has finished (success or failed)."""
        deadline = time.monotonic() + timeout_s
        while True:
            run = self.dag_run(dag_id, run_id)
            if run["state"] in ("success", "failed"):
                return run
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"{dag_id} run {run_id} still {run['state']} after {timeout_s:.0f} s: "
                    f"{self.task_states(dag_id, run_id)}"
                )
            time.sleep(2)

    def write_example_dags(self) -> Path:
        """The example DAG file in the dags folder, as docs/airflow.md puts it there:
        ``python -m hvdflow.airflow > dags/hvdflow_dags.py`` in Airflow's environment."""
        self.dags_folder.mkdir(parents=True, exist_ok=True)
        example = subprocess.run(
            [str(self.command.parent / "python"), "-m", "hvdflow.airflow"],
            capture_output=True,
            text=True,
            check=True,
            env=self.env,
            cwd=self.home,
        ).stdout
        path = self.dags_folder / "hvdflow_dags.py"
        path.write_text(example)
        return path

    def runs(self, dag_id: str) -> list[dict]:
        return self.get(f"/api/v2/dags/{dag_id}/dagRuns?order_by=run_after")["dag_runs"]

    def task_states(self, dag_id: str, run_id: str) -> dict[str, str]:
        return {task: ti["state"] for task, ti in self.task_instances(dag_id, run_id).items()}

    def xcom(self, dag_id: str, run_id: str, task_id: str):
        path = f"/api/v2/dags/{dag_id}/dagRuns/{quote(run_id)}/taskInstances/{task_id}"
        return self.get(f"{path}/xcomEntries/return_value?deserialize=true")["value"]

    def task_log(self, dag_id: str, run_id: str, task_id: str, try_number: int = 1) -> str:
        """The task's log as Airflow serves it: its events' text, one a line."""
        path = f"/api/v2/dags/{dag_id}/dagRuns/{quote(run_id)}/taskInstances/{task_id}"
        found = self.get(f"{path}/logs/{try_number}?full_content=true")
        lines = []
        for entry in found.get("content") or []:
            lines.append(entry.get("event", "") if isinstance(entry, dict) else str(entry))
        return "\n".join(lines)


def quote(run_id: str) -> str:
    return urllib.parse.quote(run_id, safe="")


ROOT = Path(__file__).resolve().parent.parent
AIRFLOW_VENV = ROOT / ".venv-airflow"


def require_airflow() -> Path:
    """Airflow's command in its environment; skip (fail under CI=true) when it is missing."""
    airflow = AIRFLOW_VENV / "bin" / "airflow"
    if not airflow.exists():
        skip_here_fail_in_ci(
            f"no Airflow environment at {AIRFLOW_VENV}: run `scripts/setup.sh airflow`",
            "the Airflow tests",
        )
    return airflow


class Airflow(LocalAirflow):
    """The checkout's Airflow (``.venv-airflow``), as the tests start it."""

    def __init__(self, home: Path, env: dict[str, str]):
        super().__init__(home, env, require_airflow())
