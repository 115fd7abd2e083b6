"""hvdflow's images (container/Dockerfile, scripts/image.sh) on a real Docker engine: built once
per lock into the engine's data root outside the clone, each runs as a non-root user on its
profile's Python and holds together as `pip check` reads it; the current profile's runs the
README's `hvdflow run` on its embedded services, as a new user of that profile starts (the
classic one runs the pipeline in test_spark_in_containers.py and test_docker_pool.py), and none
of the secrets in the classic builder's environment reaches a layer. Skipped only where no
engine can be started."""

from __future__ import annotations

import hashlib
import json
import re
import secrets
from pathlib import Path

import pytest

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


# Read back inside the container by its own Python, from the run's MLflow server.
CHAMPION = """
import json, sys, tempfile, mlflow
import importlib.metadata as m
mlflow.set_tracking_uri(sys.argv[1])  # the registry too, for models:/ URIs
client = mlflow.MlflowClient()
version = client.get_model_version_by_alias("hvdflow-classifier", "champion")
params = client.get_run(version.run_id).data.params
with tempfile.TemporaryDirectory() as dst:  # without dst_path MLflow's copy stays in /tmp
    path = mlflow.artifacts.download_artifacts(
        f"models:/hvdflow-classifier/{version.version}", dst_path=dst)
    print(json.dumps({"engine": params["engine"], "np": params["np"],
                      "requirements": open(f"{path}/requirements.txt").read().split(),
                      "tensorflow": m.version("tensorflow"),
                      "installed": sorted(d.metadata["Name"].lower().replace("_", "-")
                                          for d in m.distributions())}))
"""
CLASSIC_ONLY = {"horovod", "petastorm", "tensorflow-addons"}


def test_the_current_image_runs_the_pipeline_on_its_embedded_services_to_a_tf_collective_champion(
    current_image,
):
    """The README's main command in a container of the current profile's image, as a new user
    runs it there: `hvdflow run --np 2` on the embedded defaults (SeaweedFS, MLflow and Prefect
    started inside from the installed wheel, no checkout, no variable set), trained with the
    profile's engine and registered as the champion, whose logged requirements name the image's
    TensorFlow and not hvdflow. The services share the host's network, so this test takes turns
    with the others that take their conventional ports (the "local-services" group)."""
    env, tag = current_image
    name = f"hvdflow-test-{secrets.token_hex(4)}"
    try:
        docker(env, "run", "-d", "--name", name, "--network", "host", tag, "sleep", "infinity")
        run = docker(env, "exec", name, "hvdflow", "run", "--np", "2", timeout=900, check=False)
        assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
        assert re.search(r"aliases: candidate, champion", run.stdout), run.stdout[-2000:]
        tracking = re.search(r"MLflow run +(http://[\d.:]+)/", run.stdout).group(1)
        read = docker(env, "exec", name, "python", "-c", CHAMPION, tracking, check=False)
        assert read.returncode == 0, read.stderr[-3000:]
        found = json.loads(read.stdout.strip().splitlines()[-1])
        down = docker(env, "exec", name, "hvdflow", "down", check=False)
        assert down.returncode == 0, down.stdout + down.stderr
    finally:
        docker(env, "rm", "-f", name, check=False)
    assert docker(env, "ps", "-aq", "--filter", f"name={name}").stdout.strip() == ""
    assert (found["engine"], found["np"]) == ("tf_collective", "2")
    assert {"tensorflow", "tf-keras", "hvdflow"} <= set(found["installed"])
    assert CLASSIC_ONLY.isdisjoint(found["installed"])
    assert f"tensorflow=={found['tensorflow']}" in found["requirements"]
    assert not any("hvdflow" in line for line in found["requirements"])
