"""A Spark standalone cluster whose master and two workers are containers of hvdflow's image:
`hvdflow run` outside (on the host, as a flow would run) points HVDFLOW_SPARK_MASTER at it, and
its ranks run in the workers' containers. In epoch 3 one worker's container is killed
(`docker kill`, then started again, as a restart policy or an orchestrator would): the lost rank
is named with that container's host, and the training runs again from its checkpoint in the
same MLflow run, ending with one model version. No container is left behind.

The engine's daemon runs without a bridge here (`--bridge=none`), so the containers share the
host's network: each worker has a host name of its own (`--hostname`, as a container on a bridge
or a pod has) and an address of its own on the loopback for Spark."""

from __future__ import annotations

import json
import re
import secrets
import socket
import subprocess
import sys
import time

import pytest
from mlflow import MlflowClient

from tests.cluster.driver import output_acted_on
from tests.cluster.fixtures import upload_raw_images
from tests.container.conftest import docker
from tests.uv import CHECKOUT

pytestmark = pytest.mark.slow

# Each worker's address: the master's is the host's loopback.
WORKERS = {"w1": "127.0.0.2", "w2": "127.0.0.3"}
KILLED = "w2"
# 600 digits at batch 8: epochs of about half a second, so that the kill in epoch 3 lands while
# the first attempt still trains.
EPOCHS = 10
PER_CLASS = 60


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def spark_class(tag: str, name: str, address: str, *args: str) -> list[str]:
    """A container of the image running ``spark-class args``, whose host name (its own) resolves
    to ``address``, as a bridge network's name service would answer."""
    return ["run", "-d", "--name", name, "--hostname", name, "--add-host", f"{name}:{address}",
            "--network", "host", tag, "spark-class", *args]  # fmt: skip


def wait_for_workers(env, master: str, workers: list[str], timeout_s: float = 90) -> None:
    """Until the master's UI lists every worker alive (read from inside its container); a
    worker's container that exits fails at once, with its log's end."""
    deadline = time.monotonic() + timeout_s
    url = f"http://127.0.0.1:{env['_UI_PORT']}/json/"
    read = f"import urllib.request; print(urllib.request.urlopen({url!r}).read().decode())"
    while time.monotonic() < deadline:
        status = subprocess.run(
            ["docker", "exec", master, "python", "-c", read],
            env=env, capture_output=True, text=True, check=False,
        )  # fmt: skip
        if status.returncode == 0:
            alive = [w for w in json.loads(status.stdout)["workers"] if w["state"] == "ALIVE"]
            if len(alive) >= len(workers):
                return
        for name in workers:
            running = docker(env, "inspect", "-f", "{{.State.Running}}", name).stdout.strip()
            if running != "true":
                log = docker(env, "logs", "--tail", "15", name, check=False)
                raise AssertionError(f"worker {name} exited:\n{log.stdout}{log.stderr}")
        time.sleep(1)
    raise AssertionError(f"{len(workers)} workers did not register within {timeout_s} s")


def run_killing_a_worker(env, argv, container: str) -> tuple[int, str]:
    """``hvdflow <argv>`` on the host; ``container`` killed once epoch 3 begins, then started
    again. Returns the exit code and the output."""
    driver = subprocess.Popen(
        [sys.executable, "-m", "hvdflow.flows.cli", *argv], cwd=CHECKOUT, env=env,
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True,  # its own group: stopping it stops its JVM too
    )  # fmt: skip
    killed: list[float] = []

    def act(line: str) -> None:
        if not killed and line.rstrip().endswith(f"<log>:Epoch 3/{EPOCHS}"):
            docker(env, "kill", container)
            killed.append(time.time())
            docker(env, "start", container)

    out = output_acted_on(driver, act)
    assert killed, "the worker was never killed: did epoch 3 begin?\n" + out[-3000:]
    return driver.returncode, out


def test_ranks_in_the_workers_containers_train_and_a_killed_containers_rank_is_retried(
    image, seaweed, mlflow_server, prefect_server, store, tmp_path
):
    env, tag = image
    port, ui = free_port(), free_port()
    env = env | {"_UI_PORT": str(ui)}
    run = secrets.token_hex(4)
    master, workers = f"hvdflow-test-{run}-master", [f"hvdflow-test-{run}-{w}" for w in WORKERS]
    master_url = f"spark://127.0.0.1:{port}"
    raw = store.config.uri(store.config.key("raw")) + "/"
    upload_raw_images(store, raw, per_class=PER_CLASS)
    model = f"tests-containers-{run}"
    params = {
        "training": {"batch_size": 8},
        "tracking": {"registered_model_name": model, "experiment": model},
    }
    argv = ["run", "--np", "2", "--epochs", str(EPOCHS), "--input-format", "folders"]
    argv += ["--input", raw, "--output", store.config.uri(store.config.key("datasets"))]
    argv += ["--params", json.dumps(params)]
    services = seaweed.env() | {
        "MLFLOW_TRACKING_URI": mlflow_server.tracking_uri,
        "PREFECT_API_URL": prefect_server.api_url,
        "HVDFLOW_HOME": str(tmp_path / "home"),
        "HVDFLOW_SPARK_MASTER": master_url,
        "PYSPARK_PYTHON": "/opt/hvdflow/bin/python",  # the executors': the image's
        "SPARK_LOCAL_IP": "127.0.0.1",
    }
    try:
        docker(env, *spark_class(tag, master, "127.0.0.1", "org.apache.spark.deploy.master.Master",
               "--host", "127.0.0.1", "--port", str(port), "--webui-port", str(ui)))  # fmt: skip
        for name, address in zip(workers, WORKERS.values(), strict=True):
            docker(env, *spark_class(tag, name, address, "org.apache.spark.deploy.worker.Worker",
                   "--host", address, "--cores", "1", "--memory", "2g", "--webui-port", "0",
                   master_url))  # fmt: skip
        wait_for_workers(env, master, workers)
        code, out = run_killing_a_worker(env | services, argv, f"hvdflow-test-{run}-{KILLED}")
    finally:
        docker(env, "rm", "-f", master, *workers, check=False)
    assert docker(env, "ps", "-aq", "--filter", f"name=hvdflow-test-{run}").stdout.strip() == ""
    assert code == 0, out[-6000:]

    # The rank in the killed container is named with its host, and the next attempt resumed
    # after the last checkpoint the first one wrote.
    lost = re.search(rf"rank \d on hvdflow-test-{run}-{KILLED} \(\S+\) was lost", out)
    assert lost, out[-4000:]
    before, after = out[: lost.start()], out[lost.end() :]
    saved = [int(n) for n in re.findall(r"<log>:checkpoint of epoch (\d+) written", before)]
    resumed = re.search(r"<log>:resuming after epoch (\d+) from the checkpoint", after)
    assert saved and resumed and int(resumed.group(1)) == saved[-1], after[:3000]

    client = MlflowClient(mlflow_server.tracking_uri)
    (version,) = client.search_model_versions(f"name='{model}'")
    assert f"models:/{model}/{version.version}" in out
    training = client.get_run(version.run_id)
    assert training.data.metrics["training_attempts"] == 2
    steps = [m.step for m in client.get_metric_history(version.run_id, "val_accuracy")]
    assert sorted(steps) == list(range(EPOCHS))  # every epoch once, none trained twice
    assert training.data.metrics["val_accuracy"] > 0.8
