"""Elastic training on the multi-host harness: a host lost for good costs an attempt, not the run.

The harness's spare host joins with a worker, so that three hosts hold one rank each. ``hvdflow
run`` trains np=3 with ``launcher.min_np`` 2; in epoch 2 the third host is stopped for good (its
Spark worker, executor and rank SIGKILLed, nothing restarts them). The fault costs an attempt: the
next one runs on the two slots left, from the last checkpoint, in the same MLflow run; every
epoch's metrics exist once, the model is registered and its card says np 2. The third host stays
lost; the two the other tests use are untouched. What its killed executor unpacked stays in that
executor's work folder, not in the host's /tmp.

The other side of the rule, fewer slots left than ``min_np`` (one line naming the failure and the
slots left), is ``tests/tasks/train/test_elastic.py`` with exact slot counts: the slots this run
counts after the loss are the same call (``task_slots``) that decides it. That a lost host's rank
is named with its host is ``test_launcher_faults.py``.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time

import pytest

from tests.cluster.driver import logged_at, output_acted_on, start_cli
from tests.helpers import wait_for_no_ranks

pytestmark = pytest.mark.slow

# Epochs here take a fraction of a second: enough of them that the run is still training when
# the host's processes are gone, however late the test hears that epoch 2 began.
EPOCHS = 8
# How long a failed attempt waits for the lost slot to come back: it never does here.
ELASTIC_WAIT_S = 8


def run_losing_a_host(cluster, services, workdir, lost) -> tuple[int, str, float]:
    """``hvdflow run --np 3`` with ``launcher.min_np`` 2; ``lost`` stopped for good once epoch 2
    begins. Returns the exit code, the output, and when the host was stopped (epoch seconds)."""
    home, _env, _good = services
    launcher = {"min_np": 2, "elastic_wait_s": ELASTIC_WAIT_S}
    argv = ["run", "--np", "3", "--epochs", str(EPOCHS), "--input-format", "folders"]
    argv += ["--input", "s3://hvdflow/raw/digits/", "--output", "s3://hvdflow/datasets"]
    argv += ["--params", json.dumps({"launcher": launcher, "training": {"batch_size": 8}})]
    driver = start_cli(cluster, argv, workdir=workdir, home=home)
    killed: list[int] = []
    stopped_at: list[float] = []

    def act(line: str) -> None:
        # Epoch 2 begins once epoch 1's checkpoint is written: stop the host in epoch 2.
        if not killed and line.rstrip().endswith(f"<log>:Epoch 2/{EPOCHS}"):
            stopped_at.append(time.time())
            killed.extend(cluster.stop_host_for_good(lost))

    out = output_acted_on(driver, act)
    assert killed, "the host was never stopped: epoch 2 did not begin?\n" + out[-3000:]
    return driver.returncode, out, stopped_at[0]


def elastic_timeline(out: str, stopped_at: float) -> dict[str, float]:
    """Seconds from the host's stop to: the lost rank named, the next attempt decided, its
    first epoch begun; and the run's mean epoch (docs/benchmarks/cluster.md, "Elasticity")."""
    lines = out.splitlines()

    def first(text: str, after: int = 0) -> int:
        return next(i for i in range(after, len(lines)) if text in lines[i])

    named = first("was lost")
    decided = first("elastic training:", named)
    resumed = first("<log>:Epoch ", decided)
    epochs = [float(m) for m in re.findall(r"Epoch \d+/\d+ done in ([\d.]+)s", out)]
    return {
        "named_s": logged_at(lines[named]) - stopped_at,
        "decided_s": logged_at(lines[decided]) - stopped_at,
        "resumed_s": logged_at(lines[resumed]) - stopped_at,
        "epoch_s": sum(epochs) / len(epochs),
    }


def grow_spark_slots(env: dict, limit: int) -> None:
    """Prefect's ``spark-slots`` limit raised to ``limit`` with Prefect's CLI, as the training's
    error tells an operator whose cluster grew (an earlier run on two hosts sized it, or none)."""
    from hvdflow.flows.prefect.spark_slots import SPARK_SLOTS

    env = {**os.environ, **env}
    for verb in ("update", "create"):
        command = [sys.executable, "-m", "prefect", "gcl", verb, SPARK_SLOTS, "--limit", str(limit)]
        if subprocess.run(command, env=env, capture_output=True, timeout=120).returncode == 0:
            return
    raise AssertionError(f"could not set {SPARK_SLOTS} to {limit}")


@pytest.mark.timeout(1200)
def test_a_host_lost_for_good_costs_an_attempt_that_resumes_on_the_ranks_left(
    netns_cluster, cluster_services, tmp_path
):
    from mlflow import MlflowClient

    from hvdflow.infra._env import temporary_env

    (lost,) = netns_cluster.spare_hosts
    try:
        netns_cluster.start_worker(lost)
        grow_spark_slots(cluster_services[1], 3)  # the cluster grew: as its operator would
        code, out, stopped_at = run_losing_a_host(netns_cluster, cluster_services, tmp_path, lost)
        assert code == 0, out[-6000:]
        assert "elastic training: 2 of np=3 task slots are left" in out, out[-3000:]
        # The next attempt began from the last checkpoint the first one wrote (epoch 1's, or
        # epoch 2's when epoch 2 ended before the host's processes were gone), on two ranks.
        before, after = out.split("elastic training:", 1)
        saved = [int(n) for n in re.findall(r"<log>:checkpoint of epoch (\d+) written", before)]
        resumed = re.search(r"<log>:Epoch (\d+)/", after)
        assert saved and resumed and int(resumed.group(1)) == saved[-1] + 1, after[:3000]
        version = re.search(r"model version\s+models:/hvdflow-classifier/(\d+)", out)
        assert version, out[-3000:]
        timeline = elastic_timeline(out, stopped_at)
        print("elastic np=3 to 2: " + ", ".join(f"{k} {v:.1f}" for k, v in timeline.items()))
        assert timeline["named_s"] < 5, timeline  # named within seconds, not a timeout
    finally:
        netns_cluster.stop_host_for_good(lost)  # whatever happened, the others' tests see two

    # The lost host's executor was SIGKILLed with its task: the native libraries its JVM
    # unpacked (lz4-java's, for Spark's compressed broadcasts) lie in its work folder, which
    # Spark keeps with its logs, not loose in the host's /tmp (infra/executor_jvm.py).
    unpacked = netns_cluster.run_on_host(
        lost, "find /tmp -xdev -name 'liblz4-java-*' -o -name 'snappy-*' -o -name 'libzstd-jni-*'"
    ).stdout.split()
    assert unpacked and all(path.startswith("/tmp/work/app-") for path in unpacked), unpacked

    _home, env, _good = cluster_services
    with temporary_env(env):
        client = MlflowClient(env["MLFLOW_TRACKING_URI"])
        model = client.get_model_version("hvdflow-classifier", version.group(1))
        run = client.get_run(model.run_id)
        # Each attempt's ranks, and the model card says what really trained.
        assert run.data.params["attempt_1_np"] == "3"
        assert run.data.params["attempt_2_np"] == "2"
        assert model.tags["hvdflow.np"] == "2"
        # No epoch lost or trained twice: every epoch's point exists once.
        steps = [m.step for m in client.get_metric_history(run.info.run_id, "val_accuracy")]
        assert sorted(steps) == list(range(EPOCHS))
    assert wait_for_no_ranks(30) == []
