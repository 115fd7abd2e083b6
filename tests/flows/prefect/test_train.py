"""The training task's progress artifact in Prefect."""

from __future__ import annotations

import pytest


@pytest.mark.unit
def test_the_training_progress_artifact_moves_with_the_epochs_and_ends_at_100(monkeypatch):
    import logging

    from hvdflow.flows.prefect import train as steps
    from hvdflow.flows.prefect.train import TRAINING_PROGRESS_KEY, _ProgressArtifact
    from hvdflow.training.epoch_log import epoch_done_line, epoch_started_line

    calls = []
    monkeypatch.setattr(
        steps,
        "create_progress_artifact",
        lambda progress, key, description: (
            calls.append(("create", progress, key, description)) or "artifact-1"
        ),
    )
    monkeypatch.setattr(
        steps,
        "update_progress_artifact",
        lambda artifact_id, progress, description: calls.append(
            ("update", artifact_id, progress, description)
        ),
    )
    progress = _ProgressArtifact(TRAINING_PROGRESS_KEY, "training m", logging.getLogger("t"))
    for text in [epoch_started_line(1, 2), epoch_done_line(1, 2, 1.0, {}), "loss: 0.3"]:
        progress.see(text)
    progress.finish()
    assert calls == [
        ("create", 0.0, "hvdflow-training-progress", "training m: waiting for the first epoch"),
        ("update", "artifact-1", 50.0, "training m: 1 of 2 epochs done"),
        ("update", "artifact-1", 100.0, "training m: finished"),
    ]


@pytest.mark.unit
def test_a_progress_artifact_the_api_refuses_warns_once_and_never_fails_training(
    monkeypatch, caplog
):
    import logging

    from hvdflow.flows.prefect import train as steps
    from hvdflow.flows.prefect.train import _ProgressArtifact
    from hvdflow.training.epoch_log import epoch_done_line

    def refuse(*args, **kwargs):
        raise ConnectionError("Prefect API unreachable")

    monkeypatch.setattr(steps, "create_progress_artifact", lambda *a, **k: "id-1")
    monkeypatch.setattr(steps, "update_progress_artifact", refuse)
    caplog.set_level(logging.WARNING, "t")
    progress = _ProgressArtifact("k", "training m", logging.getLogger("t"))
    for epoch in (1, 2, 3):
        progress.see(epoch_done_line(epoch, 3, 1.0, {}))
    progress.finish()
    assert [r.getMessage() for r in caplog.records] == [
        "training progress not shown in Prefect: Prefect API unreachable"
    ]
