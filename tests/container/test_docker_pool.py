"""A Prefect Docker work pool: `hvdflow deploy --image` and a worker of type `docker` (Prefect's
own, prefect-docker) run the pipeline and scoring, each flow run in a container of hvdflow's
image, both asked for through Prefect's API. The deployments carry the services' variables, the
secret ones as references to Prefect Secret blocks; every container is gone when its run ends.

The pool has a Prefect server of its own: deployments are named by flow, and the session's
server holds the process pool's (tests/deployments.py)."""

from __future__ import annotations

import json
import os
import re
import secrets
import subprocess
import sys
from pathlib import Path

import pytest
from mlflow import MlflowClient

from tests.cluster.fixtures import upload_raw_images
from tests.container.conftest import docker
from tests.uv import CHECKOUT

pytestmark = pytest.mark.slow

PREFECT = str(Path(sys.executable).parent / "prefect")
RUN_TIMEOUT_S = 480


def hvdflow(env, *argv: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "hvdflow.flows.cli", *argv], cwd=CHECKOUT, env=env,
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip


def test_a_docker_worker_runs_the_deployed_pipeline_and_scoring_in_containers_of_the_image(
    image, seaweed, mlflow_server, store, tmp_path
):
    from prefect.client.orchestration import get_client
    from prefect.deployments import run_deployment
    from prefect.settings import PREFECT_API_URL, temporary_settings

    from hvdflow.infra.services._process import start_process, stop_process_group
    from hvdflow.infra.services.prefect_server import PrefectServer

    engine, tag = image
    run = secrets.token_hex(4)
    pool, model = f"docker-{run}", f"tests-docker-pool-{run}"
    raw = store.config.uri(store.config.key("raw")) + "/"
    scores = store.config.uri(store.config.key("scores"))
    upload_raw_images(store, raw, per_class=2)
    server = PrefectServer(tmp_path / "prefect").start()
    env = (
        engine
        | seaweed.env()
        | {
            "PREFECT_API_URL": server.api_url,
            "MLFLOW_TRACKING_URI": mlflow_server.tracking_uri,
            "HVDFLOW_HOME": str(tmp_path / "home"),
            "PREFECT_WORKER_QUERY_SECONDS": "2",
        }
    )
    tracking = {"tracking": {"registered_model_name": model, "experiment": model}}
    worker = None
    try:
        deployed = hvdflow(
            env, "deploy", "--pool", pool, "--image", tag, "--network", "host",
            "--env", "HVDFLOW_SPARK_MASTER=local[2]", "--np", "2", "--epochs", "1",
            "--score-input", raw, "--params", json.dumps(tracking),
        )  # fmt: skip
        assert deployed.returncode == 0, deployed.stdout[-2000:] + deployed.stderr[-3000:]
        assert f"in containers of {tag}" in deployed.stdout
        (tmp_path / "worker").mkdir()
        worker = start_process(
            [PREFECT, "worker", "start", "--pool", pool, "--type", "docker"],
            tmp_path / "worker.log", env, cwd=tmp_path / "worker",
        )  # fmt: skip
        with temporary_settings({PREFECT_API_URL: server.api_url}):
            trained = run_deployment(
                "hvdflow-pipeline/hvdflow-pipeline", timeout=RUN_TIMEOUT_S, tags=[run]
            )
            scoring = {"model": {"name": model}, "data": {"input": raw, "output": scores}}
            scored = run_deployment(
                "hvdflow-score/hvdflow-score", parameters={"params": scoring},
                timeout=RUN_TIMEOUT_S, tags=[run],
            )  # fmt: skip
            with get_client(sync_client=True) as client:
                deployment = client.read_deployment(trained.deployment_id)
                blocks = {b.name for b in client.read_block_documents()}
    finally:
        if worker is not None:
            stop_process_group(worker, 20)
        server.stop()
    log = (tmp_path / "worker.log").read_text()
    for flow_run in (trained, scored):
        assert flow_run.state.is_completed(), f"{flow_run.state}\n{log[-4000:]}"
        # Prefect's Docker worker records each run's container as "<engine>:<container id>".
        assert re.search(r":[0-9a-f]{64}$", flow_run.infrastructure_pid or ""), flow_run
    containers = docker(engine, "ps", "-aq", "--filter", "label=io.prefect.flow-run-id")
    assert containers.stdout.strip() == "", "a flow run's container was left behind"

    # The deployment: the image, the host's network, the services' variables; the secrets by
    # reference to Secret blocks, their values nowhere in it.
    variables = deployment.job_variables
    assert (variables["image"], variables["network_mode"]) == (tag, "host")
    assert variables["env"]["MLFLOW_TRACKING_URI"] == mlflow_server.tracking_uri
    reference = "{{ prefect.blocks.secret.hvdflow-aws-secret-access-key }}"
    assert variables["env"]["AWS_SECRET_ACCESS_KEY"] == reference
    assert "hvdflow-aws-secret-access-key" in blocks
    assert os.environ["AWS_SECRET_ACCESS_KEY"] not in json.dumps(deployment.model_dump(mode="json"))

    # The pipeline registered a version; scoring wrote its predictions into the bucket.
    client = MlflowClient(mlflow_server.tracking_uri)
    (version,) = client.search_model_versions(f"name='{model}'")
    assert client.get_model_version_by_alias(model, "champion").version == version.version
    assert [k for k in store.list_keys(store.config.key("scores")) if k.endswith(".parquet")]


def test_a_pool_whose_image_or_engine_is_missing_or_whose_service_is_on_loopback_says_so(
    tmp_path,
):
    from tests.container.conftest import engine_env

    env = engine_env() | {"HVDFLOW_HOME": str(tmp_path / "home")}
    image = f"hvdflow:missing-{secrets.token_hex(4)}"
    missing = hvdflow(env, "deploy", "--pool", "p", "--image", image)
    assert missing.returncode == 2, missing.stderr[-2000:]
    (line,) = missing.stderr.strip().splitlines()
    assert f"--image {image}: no such image on the Docker engine at" in line
    assert "make image PROFILE=classic" in line

    no_engine = env | {"DOCKER_HOST": f"unix://{tmp_path}/no-docker.sock"}
    lost = hvdflow(no_engine, "deploy", "--pool", "p", "--image", "hvdflow:classic")
    assert lost.returncode == 2, lost.stderr[-2000:]
    (line,) = lost.stderr.strip().splitlines()
    assert f"no Docker engine answers at unix://{tmp_path}/no-docker.sock" in line
    assert "apt-get install docker.io" in line and "DOCKER_HOST" in line
