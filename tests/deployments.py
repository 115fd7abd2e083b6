"""Session fixtures around a real Prefect server with its UI: ``prefect_server``, and
``deployed_pipeline_run``, one pipeline run made the way a team runs Prefect in production (a
process work pool, ``prefect deploy --all`` from prefect.yaml, a worker, a run triggered through
the API with non-default parameters). The deployment tests and the browser tests share that run.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import psutil
import pytest

ROOT = Path(__file__).resolve().parent.parent
PREFECT = str(Path(sys.executable).parent / "prefect")
POOL = "hvdflow"  # prefect.yaml's work pool
PIPELINE_DEPLOYMENT = "hvdflow-pipeline/hvdflow-pipeline"
MODEL = "tests-deployed"
# Bounds the one run: a worker's poll, the flow-run process's start, a Spark session, training.
RUN_TIMEOUT_S = 480
WORKER_STOP_TIMEOUT_S = 20.0
HOME_VAR = "HVDFLOW_HOME"  # unique to this run: it finds the run's processes


@dataclass
class DeployedRun:
    """What the deployed pipeline run left for the tests to look at."""

    api_url: str
    ui_url: str
    tracking_uri: str
    flow_run: object  # prefect.client.schemas.objects.FlowRun
    parameters: dict
    deploy_output: str
    worker_log: Path
    # Processes the worker had started that were still alive after it was stopped.
    left_alive: list[str] = field(default_factory=list)


def run_params(tmp: Path) -> dict:
    """Non-default parameters: prefect.yaml says np=2 and 5 epochs."""
    return {
        "data": {"input": str(tmp / "digits"), "output": str(tmp / "datasets")},
        "training": {"epochs": 2},
        "launcher": {"np": -1},
        "tracking": {"registered_model_name": MODEL, "experiment": MODEL},
    }


@pytest.fixture(scope="session")
def prefect_server(tmp_path_factory):
    """A real ``prefect server start`` (API and UI, sqlite) for the session."""
    from hvdflow.infra.services.prefect_server import PrefectServer

    server = PrefectServer(tmp_path_factory.mktemp("prefect-server")).start()
    try:
        yield server
    finally:
        server.stop()


def _prefect(args: list[str], env: dict, timeout_s: float = 180) -> str:
    done = subprocess.run(
        [PREFECT, *args], env=env, cwd=ROOT, capture_output=True, text=True, timeout=timeout_s
    )
    if done.returncode != 0:
        raise RuntimeError(
            f"prefect {' '.join(args)} failed ({done.returncode}):\n{done.stdout[-3000:]}"
            f"\n{done.stderr[-3000:]}"
        )
    return done.stdout


@pytest.fixture(scope="session")
def deployed_pipeline_run(prefect_server, seaweed, mlflow_server, tmp_path_factory):
    """Create the pool, deploy prefect.yaml, start a worker, run the pipeline deployment with
    non-default parameters through the API, then stop the worker and note what outlived it."""
    from prefect.deployments import run_deployment
    from prefect.settings import PREFECT_API_URL, temporary_settings

    from hvdflow.infra.services._process import start_process, stop_process_group

    tmp = tmp_path_factory.mktemp("deployed")
    env = {
        **os.environ,  # the session's object store variables (the seaweed fixture set them)
        "PREFECT_API_URL": prefect_server.api_url,
        "MLFLOW_TRACKING_URI": mlflow_server.tracking_uri,
        "HVDFLOW_HOME": str(tmp / "home"),
        "HVDFLOW_CACHE_DIR": str(tmp / "cache"),
        "SPARK_LOCAL_IP": "127.0.0.1",
        # The worker asks for work every 2 s instead of 10.
        "PREFECT_WORKER_QUERY_SECONDS": "2",
    }
    _prefect(["work-pool", "create", POOL, "--type", "process", "--overwrite"], env)
    deploy_output = _prefect(["--no-prompt", "deploy", "--all"], env)

    worker_log = tmp / "worker.log"
    worker = start_process([PREFECT, "worker", "start", "--pool", POOL], worker_log, env)
    try:
        with temporary_settings({PREFECT_API_URL: prefect_server.api_url}):
            parameters = {"params": run_params(tmp)}
            flow_run = run_deployment(
                PIPELINE_DEPLOYMENT, parameters=parameters, timeout=RUN_TIMEOUT_S
            )
    finally:
        stop_process_group(worker, WORKER_STOP_TIMEOUT_S)
    # The worker, the flow-run process it started, that one's Spark JVM and rank processes all
    # carry this run's HVDFLOW_HOME: none of them may outlive the worker's stop.
    left = _processes_with(HOME_VAR, env[HOME_VAR])
    for entry in left:  # recorded for the test to fail on; not left running after it
        with contextlib.suppress(ProcessLookupError):
            os.kill(int(entry.split()[0]), signal.SIGKILL)
    yield DeployedRun(
        api_url=prefect_server.api_url,
        ui_url=prefect_server.url,
        tracking_uri=mlflow_server.tracking_uri,
        flow_run=flow_run,
        parameters=parameters,
        deploy_output=deploy_output,
        worker_log=worker_log,
        left_alive=left,
    )


def _processes_with(name: str, value: str, wait_s: float = 10.0) -> list[str]:
    """Live processes whose environment has ``name=value`` (after up to ``wait_s`` for them to
    end), as ``pid command``."""
    deadline = time.monotonic() + wait_s
    while True:
        found = []
        for process in psutil.process_iter(["cmdline"]):
            try:
                if process.status() == psutil.STATUS_ZOMBIE:
                    continue
                if process.environ().get(name) == value:
                    found.append(f"{process.pid} {' '.join((process.info['cmdline'] or [])[:4])}")
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                continue
        if not found or time.monotonic() > deadline:
            return found
        time.sleep(0.5)
