"""A Spark standalone cluster whose master and two workers are containers of hvdflow's image:
a driver outside (on the host, as a flow would run) points HVDFLOW_SPARK_MASTER at it, and
HorovodRunner's ranks run inside the workers' containers. No container is left behind."""

from __future__ import annotations

import json
import secrets
import socket
import subprocess
import sys
import textwrap
import time

import pytest

from tests.container.conftest import docker
from tests.uv import CHECKOUT

pytestmark = pytest.mark.slow

# The driver: a session on the containers' master (the executors' Python the image's, as
# PYSPARK_PYTHON says), and two ranks that say whether they run in a container, as whom, and
# Horovod's size.
DRIVER = textwrap.dedent(
    """
    import json, os
    from hvdflow.infra import HorovodRunner
    from hvdflow.infra.spark import get_spark

    def main():
        import horovod.tensorflow as hvd
        hvd.init()
        return [os.path.exists("/.dockerenv"), os.getuid(), hvd.size(), hvd.rank()]

    conf = {"spark.executor.cores": "1", "spark.executor.memory": "1g",
            "spark.ui.enabled": "false"}
    get_spark(os.environ["HVDFLOW_SPARK_MASTER"], "containers", conf)
    print("RESULT " + json.dumps(HorovodRunner(np=2).run(main)))
    """
)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def spark_class(tag: str, name: str, *args: str) -> list[str]:
    return ["run", "-d", "--name", name, "--network", "host", tag, "spark-class", *args]


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


def test_ranks_run_in_the_workers_containers_of_a_cluster_of_the_image(image):
    env, tag = image
    port, ui = free_port(), free_port()
    env = env | {"_UI_PORT": str(ui)}
    run = secrets.token_hex(4)
    names = [f"hvdflow-test-{run}-master", f"hvdflow-test-{run}-w1", f"hvdflow-test-{run}-w2"]
    master_url = f"spark://127.0.0.1:{port}"
    try:
        docker(env, *spark_class(tag, names[0], "org.apache.spark.deploy.master.Master",
               "--host", "127.0.0.1", "--port", str(port), "--webui-port", str(ui)))  # fmt: skip
        for name in names[1:]:
            docker(env, *spark_class(tag, name, "org.apache.spark.deploy.worker.Worker",
                   "--host", "127.0.0.1", "--cores", "1", "--memory", "2g",
                   "--webui-port", "0", master_url))  # fmt: skip
        wait_for_workers(env, names[0], names[1:])
        driver = subprocess.run(
            [sys.executable, "-c", DRIVER], cwd=CHECKOUT, capture_output=True, text=True,
            timeout=300, env=env | {"HVDFLOW_SPARK_MASTER": master_url,
                                    "PYSPARK_PYTHON": "/opt/hvdflow/bin/python",
                                    "SPARK_LOCAL_IP": "127.0.0.1"},
        )  # fmt: skip
        assert driver.returncode == 0, driver.stdout[-3000:] + driver.stderr[-3000:]
        [line] = [line for line in driver.stdout.splitlines() if line.startswith("RESULT ")]
        in_container, uid, size, rank = json.loads(line.removeprefix("RESULT "))
        assert (in_container, uid, size, rank) == (True, 1000, 2, 0)
    finally:
        docker(env, "rm", "-f", *names, check=False)
    assert docker(env, "ps", "-aq", "--filter", f"name=hvdflow-test-{run}").stdout.strip() == ""
