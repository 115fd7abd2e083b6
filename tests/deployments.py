"""``deployed_pipeline_run``, a session fixture on the session's real Prefect server with its
UI (``prefect_server``, in ``tests/conftest.py``): the flows run the way a team runs Prefect in
production: ``hvdflow deploy`` to a process work pool, a worker started in an empty folder
(hvdflow installed, no checkout), a pipeline run asked for through the API with non-default
parameters, the scoring run its new champion triggers, and a small benchmark. The deployment
tests and the browser tests share these runs.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import psutil
import pytest

PREFECT = str(Path(sys.executable).parent / "prefect")
POOL = "hvdflow"  # prefect.yaml's work pool
PIPELINE_DEPLOYMENT = "hvdflow-pipeline/hvdflow-pipeline"
SCORE_DEPLOYMENT = "hvdflow-score/hvdflow-score"
BENCH_DEPLOYMENT = "hvdflow-benchmark/hvdflow-benchmark"
HVDFLOW = str(Path(sys.executable).parent / "hvdflow")
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
    score_run: object  # the scoring run the pipeline's new champion triggered, or None
    bench_run: object
    folders: tuple[Path, Path]  # where `hvdflow deploy` ran and where the worker ran: empty
    # Processes the worker had started that were still alive after it was stopped.
    left_alive: list[str] = field(default_factory=list)
    # The worker's exit code once stopped: 0 when it stopped on SIGTERM, -9 when SIGKILLed.
    worker_exit: int | None = None


def run_params(tmp: Path) -> dict:
    """Non-default parameters: the deployment's defaults say np=2 and 5 epochs."""
    return {
        "data": {"input": str(tmp / "digits"), "output": str(tmp / "datasets")},
        "training": {"epochs": 2},
        "launcher": {"np": -1},
        "tracking": {"registered_model_name": MODEL, "experiment": MODEL},
    }


def bench_params(tmp: Path) -> dict:
    """A small benchmark: plain Keras and np=1, one epoch on the digits at 8x8."""
    return {
        "data": {
            "input": str(tmp / "digits"),
            "output": str(tmp / "bench-datasets"),
            "image_size": [8, 8],
        },
        "training": {"model": "digits_mlp", "epochs": 1, "optimizer": "adam", "weights_source": ""},
        "conditions": ["keras", "1"],
        "repetitions": 1,
        "experiment": f"{MODEL}-bench",
    }


def images_to_score(folder: Path, count: int = 6) -> Path:
    """A few PNG images of digits, as a consumer's folder holds them."""
    from PIL import Image

    from hvdflow.training.digits import bundled_digits

    folder.mkdir(parents=True, exist_ok=True)
    images, labels = bundled_digits()
    for i in range(count):
        pixels = (images[i] * 255 / 16).astype("uint8")
        Image.fromarray(pixels).resize((32, 32)).save(folder / f"digit-{i}.png")
    return folder


@pytest.fixture(scope="session")
def deployed_pipeline_run(prefect_server, seaweed, mlflow_server, tmp_path_factory):
    """`hvdflow deploy` from an empty folder, a worker in another, the pipeline run through the
    API with non-default parameters, the scoring run its champion triggers, a small benchmark;
    then the worker is stopped and what outlived it noted."""
    from prefect.deployments import run_deployment
    from prefect.settings import PREFECT_API_URL, temporary_settings

    from hvdflow.infra.services._process import start_process, stop_process_group

    tmp = tmp_path_factory.mktemp("deployed")
    deploy_here, worker_here = tmp / "deploy-here", tmp / "worker-here"
    deploy_here.mkdir()
    worker_here.mkdir()
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
    env.pop("PYTHONPATH", None)  # hvdflow as installed, not this checkout's folders
    deploy_output = _run(
        [
            HVDFLOW,
            "deploy",
            "--pool",
            POOL,
            "--np",
            "2",
            "--epochs",
            "5",
            "--score-input",
            str(images_to_score(tmp / "to-score")),
            "--score-on-champion",
            "--params",
            json.dumps({"tracking": {"registered_model_name": MODEL, "experiment": MODEL}}),
        ],
        env,
        cwd=deploy_here,
    )

    worker_log = tmp / "worker.log"
    worker = start_process(
        [PREFECT, "worker", "start", "--pool", POOL], worker_log, env, cwd=worker_here
    )
    try:
        with temporary_settings({PREFECT_API_URL: prefect_server.api_url}):
            parameters = {"params": run_params(tmp)}
            flow_run = run_deployment(
                PIPELINE_DEPLOYMENT, parameters=parameters, timeout=RUN_TIMEOUT_S
            )
            score_run = _finished_run_of(SCORE_DEPLOYMENT, RUN_TIMEOUT_S)
            bench_run = run_deployment(
                BENCH_DEPLOYMENT, parameters={"params": bench_params(tmp)}, timeout=RUN_TIMEOUT_S
            )
    finally:
        stop_process_group(worker, WORKER_STOP_TIMEOUT_S)
    # The worker, the flow-run processes it started, their Spark JVMs and rank processes all
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
        score_run=score_run,
        bench_run=bench_run,
        folders=(deploy_here, worker_here),
        left_alive=left,
        worker_exit=worker.returncode,
    )


def _run(command: list[str], env: dict, cwd: Path, timeout_s: float = 180) -> str:
    done = subprocess.run(
        command, env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout_s
    )
    if done.returncode != 0:
        raise RuntimeError(
            f"{' '.join(command[:2])} failed ({done.returncode}):\n{done.stdout[-3000:]}"
            f"\n{done.stderr[-3000:]}"
        )
    return done.stdout


def _finished_run_of(deployment_name: str, timeout_s: float):
    """The first flow run of ``deployment_name`` once it is final (a triggered one appears a
    few seconds after its event); None if none finished within ``timeout_s``."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import DeploymentFilter, DeploymentFilterId

    deadline = time.monotonic() + timeout_s
    with get_client(sync_client=True) as client:
        deployment = client.read_deployment_by_name(deployment_name)
        while time.monotonic() < deadline:
            runs = client.read_flow_runs(
                deployment_filter=DeploymentFilter(id=DeploymentFilterId(any_=[deployment.id]))
            )
            if runs and runs[0].state and runs[0].state.is_final():
                return runs[0]
            time.sleep(2)
    return None


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
