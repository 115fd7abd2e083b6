"""`hvdflow run` and `hvdflow score` through Spark Connect from a worker without Java: the
pipeline ends with a champion, both ranks' output is in the run's log, and the champion scores
the images (its model shipped to the executors as a Connect artifact). Current profile only
(Connect's client needs protobuf 5 or newer, which the classic profile's TensorFlow caps
below)."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from tests.connect_client import connect_client_problem, path_without_java

pytestmark = [
    pytest.mark.slow,
    pytest.mark.current,
    pytest.mark.skipif(
        connect_client_problem() is not None,
        reason=f"no Spark Connect client in this profile ({connect_client_problem()}): "
        "runs in `make test-current`",
    ),
]


def test_the_pipeline_and_scoring_through_connect_from_a_worker_without_java(
    connect_server, tmp_path
):
    from mlflow import MlflowClient

    from hvdflow.infra.services.local import LocalServices

    home = tmp_path / "home"
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("AWS_ENDPOINT_URL", "MLFLOW_TRACKING_URI", "PREFECT_API_URL", "JAVA_HOME")
    }
    env.update(HVDFLOW_HOME=str(home), PATH=path_without_java(tmp_path / "bin"))
    try:

        def hvdflow(*argv: str) -> str:
            done = subprocess.run(
                [sys.executable, "-m", "hvdflow.flows.cli", *argv]
                + ["--spark-master", connect_server.url],
                env=env,
                cwd=tmp_path,
                capture_output=True,
                text=True,
                timeout=900,
            )
            out = done.stdout + done.stderr
            assert done.returncode == 0, out[-4000:]
            return out

        out = hvdflow("run", "--np", "2", "--params", '{"training": {"epochs": 1}}')
        assert "java" not in os.listdir(tmp_path / "bin")
        # Progress lines from Connect's progress handler (no status tracker there).
        assert re.search(r"Spark stage \d+ \(through Spark Connect\): \d+/\d+ tasks", out)

        client = MlflowClient(LocalServices(home).urls()["mlflow"])
        champion = client.get_model_version_by_alias("hvdflow-classifier", "champion")
        assert champion.version == "1"
        (log,) = (home / "logs" / "runs").glob("*/driver.log")
        text = log.read_text()
        assert "[1,0]<" in text and "[1,1]<" in text

        scored = hvdflow("score", "--input", str(home / "data" / "digits"))
        assert re.search(r"1797 images scored into .*, 0 quarantined", scored), scored[-3000:]
    finally:
        subprocess.run(
            [sys.executable, "-m", "hvdflow.flows.cli", "down"], env=env, timeout=120, check=False
        )
