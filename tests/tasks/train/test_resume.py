"""Which MLflow run `--resume` continues, against a real tracking server."""

from __future__ import annotations

import logging

import pytest
from mlflow import MlflowClient

from hvdflow.tasks.train.resume import run_to_resume


@pytest.fixture
def experiment(mlflow_server, request):
    """A client and a new experiment; the functions under test get the URI explicitly (no global
    tracking URI is set)."""
    client = MlflowClient(mlflow_server.tracking_uri)
    return client, client.create_experiment(f"tests-resume-choice-{request.node.name}")


def _run(client, experiment_id, status):
    run = client.create_run(experiment_id)
    if status != "RUNNING":
        client.set_terminated(run.info.run_id, status)
    return run.info.run_id


@pytest.mark.integration
def test_last_continues_the_newest_failed_run_and_names_a_newer_running_one(experiment, caplog):
    client, experiment_id = experiment
    _run(client, experiment_id, "FAILED")
    failed = _run(client, experiment_id, "FAILED")
    _run(client, experiment_id, "FINISHED")
    running = _run(client, experiment_id, "RUNNING")  # a driver killed mid-training leaves this
    with caplog.at_level(logging.WARNING, logger="hvdflow.tasks.train.resume"):
        assert run_to_resume(client.tracking_uri, experiment_id, "last", None) == failed
    [warning] = [r.getMessage() for r in caplog.records if r.name == "hvdflow.tasks.train.resume"]
    assert warning == (
        f"tracking.resume='last' continues failed run {failed}; newer run {running} is RUNNING "
        "and is left alone (another driver may be training it; if its driver is gone, continue "
        f"it with --resume {running})"
    )
    assert run_to_resume(client.tracking_uri, experiment_id, running, None) == running


@pytest.mark.integration
def test_last_with_only_a_running_run_says_how_to_continue_it(experiment):
    client, experiment_id = experiment
    _run(client, experiment_id, "FINISHED")
    running = _run(client, experiment_id, "RUNNING")
    with pytest.raises(ValueError) as err:
        run_to_resume(client.tracking_uri, experiment_id, "last", None)
    assert str(err.value) == (
        f"tracking.resume='last': experiment {experiment_id} has no failed run to continue; "
        f"run {running} is RUNNING: if its driver is gone (killed, its machine lost), continue "
        f"it with --resume {running}; else run without --resume"
    )


@pytest.mark.integration
def test_last_with_nothing_to_continue_says_to_run_without_resume(experiment):
    client, experiment_id = experiment
    _run(client, experiment_id, "FINISHED")
    with pytest.raises(ValueError) as err:
        run_to_resume(client.tracking_uri, experiment_id, "last", None)
    assert str(err.value) == (
        f"tracking.resume='last': experiment {experiment_id} has no failed run to continue; "
        "else run without --resume"
    )
