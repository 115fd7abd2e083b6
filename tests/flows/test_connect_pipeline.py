"""`hvdflow run` and `hvdflow score` through Spark Connect from a thin worker: the client
profile's environment (.venv-client: pyspark-client, no full pyspark, TensorFlow or torch), no
Java on PATH, the services started beside it from a full environment as a cluster's would be.
Their processes load no TensorFlow or torch (the initial weights are built on an executor), rank 1
SIGKILLed in epoch 2 is named and the training runs again from its checkpoint, the pipeline
ends with a champion, both ranks' output is in the run's log, and the champion scores the
images (its model shipped to the executors as a Connect artifact). Current profile only
(Connect's client needs protobuf 5 or newer, which the classic profile's TensorFlow caps
below)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys

import pytest

from tests.connect_client import needs_connect_client, path_without_java
from tests.helpers import rank_processes, wait_for_no_ranks
from tests.uv import CHECKOUT

# The thin worker's interpreter (scripts/setup.sh client; `make test-current` makes it).
THIN_PYTHON = CHECKOUT / ".venv-client" / "bin" / "python"

pytestmark = [
    pytest.mark.slow,
    pytest.mark.current,
    needs_connect_client,
]


# `hvdflow` as the command line runs it, saying at exit which frameworks its process loaded.
CLI_SAYING_WHAT_LOADED = """
import atexit, sys
def loaded():
    found = sorted(m for m in ("tensorflow", "torch") if m in sys.modules)
    print("frameworks loaded in the flow's process:", found or "none", flush=True)
atexit.register(loaded)
from hvdflow.flows.cli import main
sys.exit(main(sys.argv[1:]))
"""


WHAT_IS_INSTALLED = """
import json
from importlib.metadata import PackageNotFoundError, version
def installed(name):
    try:
        return bool(version(name))
    except PackageNotFoundError:
        return False
names = ("pyspark-client", "pyspark", "tensorflow", "torch", "mlflow")
print(json.dumps({name: installed(name) for name in names}))
"""


def kill_rank(rank: int) -> bool:
    """SIGKILL this session's rank ``rank`` (started by the Connect server's executors)."""
    for proc in rank_processes():
        if proc.environ().get("HOROVOD_RANK") == str(rank):
            proc.send_signal(signal.SIGKILL)
            return True
    return False


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

    assert THIN_PYTHON.exists(), "no thin worker environment: run scripts/setup.sh client"
    seen = subprocess.run(
        [str(THIN_PYTHON), "-c", WHAT_IS_INSTALLED], capture_output=True, text=True
    )
    assert json.loads(seen.stdout) == {
        "pyspark-client": True,
        "pyspark": False,  # the full distribution, its jars
        "tensorflow": False,
        "torch": False,
        "mlflow": False,  # the server's distribution: mlflow-skinny, the client, is there
    }, seen.stderr

    # A file, not `python -c`: pyspark's Connect client takes a __main__ without a file for
    # its own doctests, and looks for a SPARK_HOME, which pyspark-client has none of.
    cli = tmp_path / "hvdflow_cli.py"
    cli.write_text(CLI_SAYING_WHAT_LOADED)

    def hvdflow(*argv: str, kill_rank_1_at: str | None = None) -> str:
        process = subprocess.Popen(
            [str(THIN_PYTHON), str(cli), *argv] + ["--spark-master", connect_server.url],
            env=env,
            cwd=tmp_path,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        lines, killed = [], False
        try:
            for line in process.stdout:
                lines.append(line)
                if kill_rank_1_at and not killed and kill_rank_1_at in line:
                    killed = kill_rank(1)
            process.wait(timeout=900)
        finally:
            process.kill()
        out = "".join(lines)
        assert process.returncode == 0, out[-4000:]
        assert killed or not kill_rank_1_at, "rank 1 was never found to kill"
        return out

    try:
        # The cluster's services (object store, tracking server, Prefect), up before the worker.
        up = [sys.executable, "-m", "hvdflow.flows.cli", "up"]
        subprocess.run(up, env=env, timeout=300, check=True, capture_output=True)
        # The bundled digits are written from scikit-learn's copy, which the thin worker lacks
        # (it says so): here by the full environment, as a user's data would already be there.
        write = "import sys; from hvdflow.tasks.preprocess.sources import write_digits_tree as w; "
        write += "w(sys.argv[1])"
        digits = str(home / "data" / "digits")
        subprocess.run([sys.executable, "-c", write, digits], env=env, timeout=120, check=True)
        params = '{"training": {"epochs": 3}}'
        out = hvdflow("run", "--np", "2", "--params", params, kill_rank_1_at="Epoch 2/3")
        assert "java" not in os.listdir(tmp_path / "bin")
        # The default weights (built offline) were built by an executor: no TensorFlow here.
        assert "initial weights in a Spark task (Spark Connect)" in out
        assert "frameworks loaded in the flow's process: none" in out
        assert re.search(r"training attempt 1 of 3 failed \(.*rank 1 .*SIGKILL", out), out[-4000:]
        assert re.search(r"resuming after epoch [12]\b", out)

        client = MlflowClient(LocalServices(home).urls()["mlflow"])
        champion = client.get_model_version_by_alias("hvdflow-classifier", "champion")
        assert champion.version == "1"
        run = client.get_run(champion.run_id)
        assert run.data.metrics["training_attempts"] == 2
        logs = sorted((home / "logs" / "runs").glob("*/driver.log"))
        assert len(logs) == 2  # one per attempt
        text = logs[-1].read_text()
        assert "[1,0]<" in text and "[1,1]<" in text

        scored = hvdflow("score", "--input", str(home / "data" / "digits"))
        assert re.search(r"1797 images scored into .*, 0 quarantined", scored), scored[-3000:]
        assert "frameworks loaded in the flow's process: none" in scored
        assert wait_for_no_ranks() == []
    finally:
        subprocess.run(
            [sys.executable, "-m", "hvdflow.flows.cli", "down"], env=env, timeout=120, check=False
        )
