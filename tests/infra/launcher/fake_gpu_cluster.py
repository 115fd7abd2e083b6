"""A Spark standalone master and one worker on 127.0.0.1 whose GPUs are discovery scripts.

Spark schedules GPUs only on a cluster manager (local mode ignores task resources and never
starts such a task), so the GPU behaviour of the runners is tested on a real standalone
cluster; the GPUs themselves are faked the way Spark's and spark-tensorflow-distributor's own
tests fake them: a script that prints ``{"name": "gpu", "addresses": [...]}``.
"""

from __future__ import annotations

import json
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from hvdflow.infra.ports import unclaimed_port
from tests.cluster import processes
from tests.cluster.spark_cluster import MASTER, WORKER, _spark_class, _spark_env


def discovery_script(path: Path, count: int, name: str = "gpu") -> Path:
    """A GPU discovery script, as Spark runs it: it prints the addresses 0..count-1."""
    addresses = json.dumps({"name": name, "addresses": [str(i) for i in range(count)]})
    path.write_text(f"#!/usr/bin/env bash\necho '{addresses}'\n")
    path.chmod(0o755)
    return path


@contextmanager
def fake_gpu_cluster(workdir: Path, *, cores: int = 8, gpus: int = 8) -> Iterator[str]:
    """Yields the master URL of a cluster with one worker of ``cores`` cores and ``gpus`` GPUs."""
    workdir.mkdir(parents=True, exist_ok=True)
    script = discovery_script(workdir / "gpus.sh", gpus)
    port, webui = _free_port(), _free_port()
    # Executors import hvdflow as installed: a PYTHONPATH with the checkout would shadow it.
    env = {k: v for k, v in _spark_env().items() if k != "PYTHONPATH"}
    env.update({"SPARK_LOCAL_IP": "127.0.0.1", "PYSPARK_PYTHON": sys.executable})
    procs = [
        processes.start(
            [_spark_class(), MASTER, "--host", "127.0.0.1", "--port", str(port)]
            + ["--webui-port", str(webui)],
            log=workdir / "master.log",
            env=env,
        )
    ]
    master_url = f"spark://127.0.0.1:{port}"
    try:
        worker_opts = (
            f"-Dspark.worker.resource.gpu.amount={gpus} "
            f"-Dspark.worker.resource.gpu.discoveryScript={script}"
        )
        procs.append(
            processes.start(
                [_spark_class(), WORKER, "--host", "127.0.0.1", "--cores", str(cores)]
                + ["--memory", "2g", "--webui-port", str(_free_port())]
                + ["--work-dir", str(workdir / "work"), master_url],
                log=workdir / "worker.log",
                env={**env, "SPARK_WORKER_OPTS": worker_opts},
            )
        )
        _wait_for_a_worker(f"http://127.0.0.1:{webui}/json/", procs, workdir)
        yield master_url
    finally:
        processes.stop_groups(procs)


def _wait_for_a_worker(status_url: str, procs, workdir: Path, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if any(p.poll() is not None for p in procs):
            break
        try:
            with urllib.request.urlopen(status_url, timeout=2) as response:
                if any(w["state"] == "ALIVE" for w in json.load(response)["workers"]):
                    return
        except OSError:
            pass
        time.sleep(0.5)
    logs = "\n".join(
        f"--- {log.name}\n" + "\n".join(log.read_text(errors="replace").splitlines()[-20:])
        for log in (workdir / "master.log", workdir / "worker.log")
        if log.exists()
    )
    raise RuntimeError(f"the fake-GPU Spark worker did not register within {timeout_s:g} s\n{logs}")


def _free_port() -> int:
    return unclaimed_port("127.0.0.1")  # below the ephemeral range (tests.cluster.spark_cluster)
