"""A driver's claim on the MLflow run it trains, against a real tracking server: a second
execution of the same step waits while another live process trains the run, and goes on once
that process ended the run or was SIGKILLed (its stamp then goes stale)."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import pytest
from mlflow import MlflowClient

from hvdflow.tasks.train import lease

# Another driver: holds the lease on a run, says so, then ends the run after HOLD_S (or never,
# when killed first).
HOLDER = """
import sys, time
from mlflow import MlflowClient
from hvdflow.tasks.train import lease
lease.REFRESH_S = 0.5
client = MlflowClient(sys.argv[1])
run_id, hold_s = sys.argv[2], float(sys.argv[3])
with lease.driver_lease(client, run_id):
    while lease.ALIVE_TAG not in client.get_run(run_id).data.tags:
        time.sleep(0.1)
    print("held", flush=True)
    time.sleep(hold_s)
client.set_terminated(run_id, "FINISHED")
"""


@pytest.fixture
def run_id(mlflow_server, request):
    client = MlflowClient(mlflow_server.tracking_uri)
    experiment_id = client.create_experiment(f"tests-lease-{request.node.name}")
    return client.create_run(experiment_id).info.run_id


def _holder(tracking_uri: str, run_id: str, hold_s: float) -> subprocess.Popen:
    process = subprocess.Popen(
        [sys.executable, "-c", HOLDER, tracking_uri, run_id, str(hold_s)],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert process.stdout.readline().strip() == "held"
    return process


@pytest.mark.integration
def test_a_second_execution_waits_for_the_live_driver_to_end_the_run(mlflow_server, run_id):
    client = MlflowClient(mlflow_server.tracking_uri)
    holder = _holder(mlflow_server.tracking_uri, run_id, hold_s=4.0)
    try:
        started = time.monotonic()
        assert lease.wait_while_held(client, run_id, "DAG run d/r", poll_s=0.2) is True
        waited = time.monotonic() - started
        assert client.get_run(run_id).info.status == "FINISHED"
        assert waited > 2.0, waited  # it did not go on while the other trained
    finally:
        holder.kill()
        holder.wait()


@pytest.mark.integration
def test_a_driver_killed_without_ending_the_run_lets_the_next_go_on(
    mlflow_server, run_id, monkeypatch
):
    client = MlflowClient(mlflow_server.tracking_uri)
    monkeypatch.setattr(lease, "STALE_S", 3.0)
    holder = _holder(mlflow_server.tracking_uri, run_id, hold_s=600.0)
    assert (
        lease.live_driver(client.get_run(run_id))
        == client.get_run(run_id).data.tags[lease.DRIVER_TAG]
    )
    holder.send_signal(signal.SIGKILL)
    holder.wait()
    started = time.monotonic()
    assert lease.wait_while_held(client, run_id, "DAG run d/r", poll_s=0.2) is True
    # The holder stamped every 0.5 s and STALE_S is 3 s: the wait ends about 2.5-3 s after the
    # kill. Under 1 s, it did not wait for the stamp to go stale; over 10, staleness was missed.
    assert 1.0 < time.monotonic() - started < 10.0
    assert client.get_run(run_id).info.status == "RUNNING"  # its driver died with it open


@pytest.mark.integration
def test_a_run_never_stamped_or_stamped_by_this_process_is_not_waited_for(mlflow_server, run_id):
    client = MlflowClient(mlflow_server.tracking_uri)
    assert lease.wait_while_held(client, run_id, "DAG run d/r") is False
    with lease.driver_lease(client, run_id):
        deadline = time.monotonic() + 10
        while lease.ALIVE_TAG not in client.get_run(run_id).data.tags:
            assert time.monotonic() < deadline
            time.sleep(0.1)
        # This process's own lease: a retry inside the same driver goes on at once.
        assert lease.wait_while_held(client, run_id, "DAG run d/r") is False
