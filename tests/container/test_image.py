"""hvdflow's image (container/Dockerfile, scripts/image.sh) on a real Docker engine: built once
per lock into the engine's data root outside the clone, it runs the pipeline against the
session's object store, MLflow and Prefect, as a non-root user, and none of the secrets in its
builder's environment reaches a layer. Skipped only where no engine can be started."""

from __future__ import annotations

import json
import secrets
import subprocess
import tarfile

import pytest
from mlflow import MlflowClient

from tests.container.conftest import docker
from tests.security.test_no_secret_in_records import occurrences

pytestmark = pytest.mark.slow


def test_the_image_runs_as_a_user_and_no_builders_secret_is_in_a_layer(image, planted):
    env, tag = image
    assert docker(env, "run", "--rm", tag, "id", "-u").stdout.strip() == "1000"

    def records():
        """Every file of every layer, and the image's config and history, streamed from
        `docker save` (5 GB: never written out)."""
        with subprocess.Popen(["docker", "save", tag], env=env, stdout=subprocess.PIPE) as saved:
            with tarfile.open(fileobj=saved.stdout, mode="r|") as outer:
                for member in outer:
                    if not member.isfile():
                        continue
                    data = outer.extractfile(member)
                    if not member.name.endswith("layer.tar"):
                        yield member.name, data.read()  # the config: environment, history
                        continue
                    with tarfile.open(fileobj=data, mode="r|") as layer:
                        for inner in layer:
                            if inner.isfile():
                                yield f"{member.name}:{inner.name}", layer.extractfile(inner).read()
        assert saved.returncode == 0

    # hvdflow's own metadata is found where it lies: the search reads the layers' files.
    found = occurrences(planted | {"control": "Name: hvdflow\n"}, records())
    assert any(where.startswith("control in ") and "METADATA" in where for where in found)
    assert [where for where in found if not where.startswith("control in ")] == []


def test_the_pipeline_in_a_container_ends_with_a_registered_version(
    image, seaweed, mlflow_server, prefect_server
):
    env, tag = image
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
