"""Rank 0's epoch metrics reach MLflow in order, and an outage is said once, however it shows."""

import logging
import threading

import pytest

from hvdflow.training.metrics_sender import EpochMetricsSender


class _Tracker:
    """Stands in for MlflowClient: records what arrives, and fails or hangs when told to."""

    def __init__(self, refuse: int = 0, hang: threading.Event | None = None):
        self.refuse = refuse
        self.hang = hang
        self.arrived: list[int] = []

    def log_batch(self, run_id, metrics):
        if self.refuse:
            self.refuse -= 1
            raise ConnectionError("connection refused")
        if self.hang is not None:
            self.hang.wait(30)
            self.hang = None
        self.arrived.append(metrics[0].step)


def _said(caplog):
    return [r.getMessage() for r in caplog.records if r.getMessage().startswith("MLflow:")]


@pytest.mark.unit
def test_a_refusing_server_costs_no_epoch_and_is_reported_once(caplog):
    caplog.set_level(logging.INFO, logger="hvdflow.infra.launcher._wire")
    tracker = _Tracker(refuse=3)
    sender = EpochMetricsSender("run", retry_s=0.05, client=tracker)
    for epoch in range(4):
        sender.put(epoch, {"loss": 1.0 / (epoch + 1)})
    assert sender.close(flush_s=10) == []
    assert tracker.arrived == [0, 1, 2, 3] and sender.sent == [0, 1, 2, 3]
    said = _said(caplog)
    assert len(said) == 2, said
    assert said[0].startswith("MLflow: could not log epoch 1 (ConnectionError); training goes on")
    assert said[1].startswith("MLflow: tracking server back after")


@pytest.mark.unit
def test_a_send_held_in_retries_is_an_outage_too(caplog):
    # A server stopped in the middle of a send leaves MLflow's client retrying for minutes
    # without an error; the warning must not wait for that.
    caplog.set_level(logging.INFO, logger="hvdflow.infra.launcher._wire")
    released = threading.Event()
    tracker = _Tracker(hang=released)
    sender = EpochMetricsSender("run", retry_s=0.05, client=tracker)
    sender.put(0, {"loss": 1.0})
    sender.put(1, {"loss": 0.5})
    for _ in range(200):
        if _said(caplog):
            break
        threading.Event().wait(0.01)
    assert _said(caplog) == [
        "MLflow: could not log epoch 1 (no answer); training goes on, its metrics are kept and "
        "sent when the tracking server is back"
    ]
    assert tracker.arrived == []
    released.set()
    assert sender.close(flush_s=10) == []
    assert tracker.arrived == [0, 1]
    assert _said(caplog)[1].startswith("MLflow: tracking server back after")


@pytest.mark.unit
def test_a_server_that_stays_down_leaves_the_unsent_epochs_to_the_driver(caplog):
    caplog.set_level(logging.INFO, logger="hvdflow.infra.launcher._wire")
    tracker = _Tracker(refuse=10**6)
    sender = EpochMetricsSender("run", retry_s=0.05, client=tracker)
    sender.put(0, {"loss": 1.0})
    sender.put(1, {"loss": 0.5})
    assert sender.close(flush_s=0.2) == [0, 1]
    assert tracker.arrived == []
    assert "epochs [1, 2] not sent before training ended" in _said(caplog)[-1]
