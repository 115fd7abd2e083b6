"""The current profile as a new user gets it: hvdflow's wheel in a fresh Python 3.13
environment with requirements/current.txt (installed by uv), and ``hvdflow run --np 2`` on the
embedded defaults.

It runs under the current profile only (``make test-current``): the classic profile's own
environment is the one its suite runs in.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

from tests.uv import run_cached_first, uv, uv_env
from tests.wheel import ROOT, build_wheel

pytestmark = [
    pytest.mark.slow,
    pytest.mark.current,
    pytest.mark.skipif(
        sys.version_info < (3, 13), reason="the current profile's check (make test-current)"
    ),
]

CLASSIC_ONLY = {"horovod", "petastorm", "tensorflow-addons"}
# What the test session exports for its own services; a new user's shell has none of it.
SESSION_PREFIXES = ("HVDFLOW_", "MLFLOW_", "AWS_", "PREFECT_", "SPARK_", "PYSPARK_", "PYTHON")

# Read back by the fresh environment's own Python, from the run's MLflow server.
CHAMPION = """
import json, sys, tempfile, mlflow
mlflow.set_tracking_uri(sys.argv[1])  # the registry too, for models:/ URIs
client = mlflow.MlflowClient()
version = client.get_model_version_by_alias("hvdflow-classifier", "champion")
params = client.get_run(version.run_id).data.params
with tempfile.TemporaryDirectory() as dst:  # without dst_path MLflow's copy stays in /tmp
    path = mlflow.artifacts.download_artifacts(
        f"models:/hvdflow-classifier/{version.version}", dst_path=dst)
    print(json.dumps({"engine": params["engine"], "np": params["np"],
                      "requirements": open(f"{path}/requirements.txt").read().split()}))
"""


LIST = "import importlib.metadata as m; print(*(d.metadata['Name'] for d in m.distributions()))"


def fresh_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(SESSION_PREFIXES)}
    env.pop("VIRTUAL_ENV", None)
    return env


def test_the_wheel_in_a_fresh_python_313_trains_with_tf_collective_and_registers_a_champion(
    tmp_path,
):
    wheel = build_wheel(tmp_path)
    venv = tmp_path / "env"
    # uv does what `python -m venv` and `pip install -c` do, from the cache the profiles share:
    # seconds where pip copied 3 GB (tests/test_package.py installs the wheel with pip itself).
    subprocess.run(
        [uv(), "venv", "--quiet", "--python", sys.executable, str(venv)],
        check=True, timeout=120, env=uv_env(),
    )  # fmt: skip
    python, hvdflow = str(venv / "bin" / "python"), str(venv / "bin" / "hvdflow")
    env = {**fresh_env(), "PATH": f"{venv / 'bin'}:{os.environ['PATH']}"}
    # uv's own default, as a new user's `uv pip install` has it: no bytecode at install (the
    # profiles compile theirs for the suite's ~600 processes); the run below writes what it
    # imports, since a new user's shell has no PYTHONDONTWRITEBYTECODE.
    install_env = {k: v for k, v in uv_env().items() if k != "UV_COMPILE_BYTECODE"}
    install = run_cached_first(
        [uv(), "pip", "install", "--quiet", "--python", python,
         "-c", str(ROOT / "requirements" / "current.txt"),
         f"hvdflow[tensorflow] @ {wheel.as_uri()}"],
        env=install_env, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert install.returncode == 0, install.stderr[-3000:]
    listed = subprocess.run(
        [python, "-c", LIST], env=env, capture_output=True, text=True, check=True
    ).stdout.split()
    installed = {name.lower().replace("_", "-") for name in listed}
    assert installed & CLASSIC_ONLY == set()
    assert {"tensorflow", "tf-keras", "hvdflow"} <= installed

    env["HVDFLOW_HOME"] = str(tmp_path / "home")
    try:
        run = subprocess.run(
            [hvdflow, "run", "--np", "2"],
            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900,
        )  # fmt: skip
        assert run.returncode == 0, (run.stdout + run.stderr)[-4000:]
        assert re.search(r"aliases: candidate, champion", run.stdout), run.stdout[-2000:]
        tracking = re.search(r"MLflow run +(http://[\d.:]+)/", run.stdout).group(1)
        champion = subprocess.run(
            [python, "-c", CHAMPION, tracking], env=env, capture_output=True, text=True,
            timeout=120,
        )  # fmt: skip
        assert champion.returncode == 0, champion.stderr[-3000:]
        found = json.loads(champion.stdout.strip().splitlines()[-1])
    finally:
        subprocess.run([hvdflow, "down"], env=env, capture_output=True, timeout=120)
    assert (found["engine"], found["np"]) == ("tf_collective", "2")
    names = {line.split("==")[0] for line in found["requirements"]}
    assert f"tensorflow=={version_in(python, 'tensorflow', env)}" in found["requirements"]
    assert not any("hvdflow" in name for name in names)


def version_in(python: str, distribution: str, env: dict) -> str:
    done = subprocess.run(
        [python, "-c", f"import importlib.metadata as m; print(m.version({distribution!r}))"],
        env=env, capture_output=True, text=True, check=True,
    )  # fmt: skip
    return done.stdout.strip()
