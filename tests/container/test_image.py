"""hvdflow's images (container/Dockerfile, scripts/image.sh) on a real Docker engine: built once
per lock into the engine's data root outside the clone, each runs as a non-root user on its
profile's Python and holds together as `pip check` reads it; the current profile's runs the
pipeline against the session's object store, MLflow and Prefect (the classic one runs it in
test_spark_in_containers.py and test_docker_pool.py), and none of the secrets in the classic
builder's environment reaches a layer. Skipped only where no engine can be started."""

from __future__ import annotations

import json
import secrets
import subprocess

import pytest
from mlflow import MlflowClient

from tests.container.conftest import docker

pytestmark = pytest.mark.slow


@pytest.mark.parametrize(("profile", "python"), [("classic", "3.11"), ("current", "3.13")])
def test_each_profiles_image_runs_as_a_user_on_its_python_and_passes_pip_check(
    profile, python, request
):
    env, tag = request.getfixturevalue("image" if profile == "classic" else "current_image")
    asked = "id -u; python -c 'import sys; print(sys.version[:4])'; python -m pip check"
    ran = docker(env, "run", "--rm", tag, "sh", "-c", asked, check=False)
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert ran.stdout.split()[:2] == ["1000", python]
    assert "No broken requirements found." in ran.stdout


def test_no_builders_secret_is_in_a_layer_of_the_image(image, planted):
    env, tag = image
    # `docker save` streams the layers as plain tar: a file's bytes lie together in it, so a
    # search of the stream reads every file of every layer, and the config (environment,
    # history). hvdflow's own metadata is the control: found, the search reads the files.
    needles = {name: secret.encode() for name, secret in planted.items()}
    needles["control"] = b"Name: hvdflow\n"
    found, tail, overlap = set(), b"", max(len(n) for n in needles.values())
    with subprocess.Popen(["docker", "save", tag], env=env, stdout=subprocess.PIPE) as saved:
        while chunk := saved.stdout.read(16 * 2**20):
            window, tail = tail + chunk, (tail + chunk)[-overlap:]
            found |= {name for name, needle in needles.items() if needle in window}
    assert saved.returncode == 0
    assert found == {"control"}, f"in the image's layers: {sorted(found - {'control'})}"


def test_the_pipeline_in_a_container_ends_with_a_registered_version(
    current_image, seaweed, mlflow_server, prefect_server
):
    env, tag = current_image
    services = seaweed.env() | {
        "MLFLOW_TRACKING_URI": mlflow_server.tracking_uri,
        "PREFECT_API_URL": prefect_server.api_url,
        "HVDFLOW_SPARK_MASTER": "local[2]",
    }
    variables = [arg for key, value in services.items() for arg in ("-e", f"{key}={value}")]
    name = f"hvdflow-test-{secrets.token_hex(4)}"
    model = "tests-container"
    tracking = {"tracking": {"registered_model_name": model, "experiment": model}}
    run = ["hvdflow", "run", "--np", "2", "--epochs", "1", "--params", json.dumps(tracking)]
    try:
        done = docker(
            env, "run", "--rm", "--name", name, "--network", "host", *variables, tag, *run,
            timeout=900, check=False,
        )  # fmt: skip
    finally:
        docker(env, "rm", "-f", name, check=False)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    version = MlflowClient(mlflow_server.tracking_uri).get_model_version_by_alias(
        model, "candidate"
    )
    assert f"models:/{model}/{version.version}" in done.stdout
    assert docker(env, "ps", "-aq", "--filter", f"name={name}").stdout.strip() == ""
