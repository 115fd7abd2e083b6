"""Elastic training on the multi-host harness: a host lost for good costs an attempt, not the run.

``hvdflow run`` trains np=2 with ``launcher.min_np`` 1, one rank per host. In epoch 2, the
second host is stopped for good: its Spark worker, executor and rank are SIGKILLed and
nothing restarts them. The next attempt finds one task slot, runs on one rank from the last
checkpoint in the same MLflow run, and registers the model; the model card says np 1. The host's
worker is started again afterwards, for the tests that follow.
"""

from __future__ import annotations

import re
import subprocess
import sys
import threading

import psutil
import pytest

from tests.cluster import processes
from tests.cluster.driver import PROJECT_ROOT, driver_env
from tests.cluster.spark_cluster import _net_inode, _start_worker, _wait_for_workers
from tests.helpers import wait_for_no_ranks

pytestmark = pytest.mark.slow

EPOCHS = 6


def stop_host_for_good(cluster, host) -> list[int]:
    """SIGKILL every process of ``host`` (its worker, executor, ranks) but its anchor."""
    inode = cluster.netns_inodes[host.netns]
    anchor = cluster.anchors[host.name]
    killed = []
    for proc in psutil.process_iter():
        try:
            if proc.pid != anchor and _net_inode(proc.pid) == inode:
                proc.kill()
                killed.append(proc.pid)
        except psutil.Error:
            continue
    return killed


@pytest.mark.timeout(1200)
def test_a_host_lost_for_good_mid_training_resumes_on_the_ranks_left(
    netns_cluster, cluster_services, tmp_path
):
    from mlflow import MlflowClient

    from hvdflow.infra._env import temporary_env

    home, env, _good = cluster_services
    lost = netns_cluster.hosts[-1]
    command = [sys.executable, "-m", "hvdflow.flows.cli", "run", "--np", "2"]
    command += ["--epochs", str(EPOCHS), "--input-format", "folders"]
    command += ["--input", "s3://hvdflow/raw/digits/", "--output", "s3://hvdflow/datasets"]
    command += ["--params", '{"launcher": {"min_np": 1}, "training": {"batch_size": 8}}']
    driver = subprocess.Popen(
        command,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**driver_env(netns_cluster, tmp_path / "conf"), "HVDFLOW_HOME": str(home)},
        cwd=str(PROJECT_ROOT),
        start_new_session=True,
    )
    output: list[str] = []
    killed: list[int] = []

    def watch() -> None:
        for line in driver.stdout:
            output.append(line)
            # Epoch 2 begins once epoch 1's checkpoint is written: stop the host in epoch 2.
            if not killed and line.rstrip().endswith(f"<log>:Epoch 2/{EPOCHS}"):
                killed.extend(stop_host_for_good(netns_cluster, lost))

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        driver.wait(timeout=1000)
        watcher.join(10)
        out = "".join(output)
        assert killed, "the host was never stopped: epoch 2 did not begin?\n" + out[-3000:]
        assert driver.returncode == 0, out[-6000:]
        assert "elastic training: 1 of np=2 task slots are left" in out, out[-3000:]
        # The next attempt began at epoch 2, from epoch 1's checkpoint, on one rank.
        after = out.split("elastic training:", 1)[1]
        resumed = re.search(r"<log>:Epoch (\d+)/", after)
        assert resumed and resumed.group(1) == "2", after[:3000]
        version = re.search(r"model version\s+models:/hvdflow-classifier/(\d+)", out)
        assert version, out[-3000:]

        with temporary_env(env):
            client = MlflowClient(env["MLFLOW_TRACKING_URI"])
            model = client.get_model_version("hvdflow-classifier", version.group(1))
            run = client.get_run(model.run_id)
            # Each attempt's ranks, and the model card says what really trained.
            assert run.data.params["attempt_1_np"] == "2"
            assert run.data.params["attempt_2_np"] == "1"
            assert model.tags["hvdflow.np"] == "1"
            # No epoch lost or trained twice: every epoch's point exists once.
            steps = [m.step for m in client.get_metric_history(run.info.run_id, "val_accuracy")]
            assert sorted(steps) == list(range(EPOCHS))
    finally:
        processes.stop_groups([driver], grace_s=5)
        # The host comes back for the tests that follow: a new worker in its namespace, in
        # place of the one killed (the cluster counts an exited process as a failed start).
        netns_cluster._procs[:] = [p for p in netns_cluster._procs if p.poll() is None]
        netns_cluster._procs.append(_start_worker(netns_cluster, lost, cores=1, memory="2g"))
        _wait_for_workers(netns_cluster, len(netns_cluster.hosts), timeout_s=120)
    assert wait_for_no_ranks(30) == []
