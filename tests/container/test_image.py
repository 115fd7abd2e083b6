"""hvdflow's images (container/Dockerfile, scripts/image.sh) on a real Docker engine: built once
per lock into the engine's data root outside the clone, each runs as a non-root user on its
profile's Python and holds together as `pip check` reads it; the current profile's runs the
pipeline against the session's object store, MLflow and Prefect (the classic one runs it in
test_spark_in_containers.py and test_docker_pool.py), and none of the secrets in the classic
builder's environment reaches a layer. Skipped only where no engine can be started."""

from __future__ import annotations

import hashlib
import json
import secrets
from pathlib import Path

import pytest
from mlflow import MlflowClient

from tests.container.conftest import ENGINE_ROOT, docker

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


def layer_folders(env, tag: str) -> list[tuple[str, Path]]:
    """Each layer of ``tag`` as (its digest, the folder of its files on the engine), bottom
    first: overlay2 names the top layer's folder UpperDir and the others LowerDir, top first."""
    (image,) = json.loads(docker(env, "image", "inspect", tag).stdout)
    assert image["GraphDriver"]["Name"] == "overlay2", image["GraphDriver"]["Name"]
    data = image["GraphDriver"]["Data"]
    folders = [data["UpperDir"], *data.get("LowerDir", "").split(":")]
    digests = image["RootFS"]["Layers"]
    assert len(folders) == len(digests), (folders, digests)
    return [(d, Path(f)) for d, f in zip(digests, reversed(folders), strict=True)]


def found_in(folder: Path, needles: dict[str, bytes]) -> set[str]:
    found = set()
    for path in folder.rglob("*"):
        if path.is_file() and not path.is_symlink():
            data = path.read_bytes()
            found |= {name for name, needle in needles.items() if needle in data}
    return found


def test_no_builders_secret_is_in_a_layer_of_the_image(image, planted):
    env, tag = image
    # Every file of every layer, read where the engine keeps it, and the image's config (its
    # environment, its history). hvdflow's own metadata is the control: found, the search read
    # the files. A layer is named by the digest of its content, so one found clean of these
    # secrets stays clean: only the layers new since the last search are read (hvdflow's own
    # after a change of its code; all of them after a new lock).
    needles = {name: secret.encode() for name, secret in planted.items()}
    needles["control"] = b"Name: hvdflow\n"
    seen_file = ENGINE_ROOT / "searched-layers.json"
    key = hashlib.sha256(json.dumps(needles, default=bytes.hex).encode()).hexdigest()[:16]
    seen = json.loads(seen_file.read_text()) if seen_file.exists() else {}
    seen = seen.get(key, {})
    found = {
        name for name, needle in needles.items()
        if needle in docker(env, "image", "inspect", tag).stdout.encode()
    }  # fmt: skip
    for digest, folder in layer_folders(env, tag):
        if digest not in seen:
            seen[digest] = sorted(found_in(folder, needles))
        found |= set(seen[digest])
    seen_file.write_text(json.dumps({key: seen}))
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
