"""A real Spark standalone cluster on 127.0.0.1: one master and one-core workers.

Started from the pyspark package's own ``spark-class``, as a user would on their machines.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
import urllib.request
from contextlib import contextmanager
from pathlib import Path

import pyspark

from hvdflow.infra.services import free_port

SPARK_HOME = Path(pyspark.__file__).parent
MASTER = "org.apache.spark.deploy.master.Master"
WORKER = "org.apache.spark.deploy.worker.Worker"


def _spark_class(*args: str, log: Path, env: dict) -> subprocess.Popen:
    return subprocess.Popen(
        [str(SPARK_HOME / "bin" / "spark-class"), *args],
        stdout=log.open("wb"),
        stderr=subprocess.STDOUT,
        env=env,
        start_new_session=True,  # its own group: stopping it stops whatever it started
    )


def _alive_workers(webui_port: int) -> int:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{webui_port}/json/", timeout=2) as r:
            return int(json.load(r).get("aliveworkers", 0))
    except OSError:
        return 0


@contextmanager
def standalone_cluster(workdir: Path, workers: int = 2, cores: int = 1, timeout_s: float = 90):
    """Yield the master URL once every worker has registered; stop everything afterwards."""
    env = {**os.environ, "SPARK_HOME": str(SPARK_HOME), "SPARK_LOCAL_IP": "127.0.0.1"}
    port, webui = free_port(), free_port()
    procs = [
        _spark_class(
            MASTER,
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--webui-port",
            str(webui),
            log=workdir / "master.log",
            env=env,
        )
    ]
    url = f"spark://127.0.0.1:{port}"
    try:
        for i in range(workers):
            procs.append(
                _spark_class(
                    WORKER,
                    "--host",
                    "127.0.0.1",
                    "--cores",
                    str(cores),
                    "--memory",
                    "2g",
                    "--webui-port",
                    str(free_port()),
                    "--work-dir",
                    str(workdir / f"work{i}"),
                    url,
                    log=workdir / f"worker{i}.log",
                    env=env,
                )
            )
        deadline = time.monotonic() + timeout_s
        while _alive_workers(webui) < workers:
            if time.monotonic() > deadline:
                logs = "\n".join(p.read_text()[-2000:] for p in workdir.glob("*.log"))
                raise RuntimeError(f"standalone cluster not up within {timeout_s} s:\n{logs}")
            time.sleep(0.5)
        yield url
    finally:
        for proc in reversed(procs):
            try:
                os.killpg(proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                continue
        for proc in procs:
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(5)
