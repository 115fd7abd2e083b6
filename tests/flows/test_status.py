"""`hvdflow status`: the services and the last runs, as a person reads them."""

from __future__ import annotations

import time

import pytest

from hvdflow.flows.cli import main
from hvdflow.flows.status import RunStatus, ServiceStatus, Status, render, service_statuses


@pytest.mark.unit
def test_the_status_is_a_few_lines_naming_services_versions_and_the_champion():
    started = int(time.mktime((2026, 11, 22, 10, 31, 0, 0, 0, -1)) * 1000)
    status = Status(
        home="/home/u/.hvdflow",
        services=[
            ServiceStatus("s3", "http://127.0.0.1:8333", True),
            ServiceStatus("mlflow", "https://mlflow.example.org", True, "MLFLOW_TRACKING_URI"),
            ServiceStatus("prefect", None, False),
        ],
        model="hvdflow-classifier",
        experiment="hvdflow",
        runs=[
            RunStatus(started, "FINISHED", "r2", "4", ("candidate",), 0.95, "f2", "Completed"),
            RunStatus(started - 3_600_000, "FAILED", "r1", flow_run_id="f1"),
        ],
        aliases={"champion": "3", "candidate": "4"},
    )
    assert render(status) == [
        "services (HVDFLOW_HOME /home/u/.hvdflow):",
        "  object store (S3)  up    http://127.0.0.1:8333",
        "  MLflow UI          up    https://mlflow.example.org  (from MLFLOW_TRACKING_URI)",
        "  Prefect UI         down  start it with: hvdflow up",
        "model hvdflow-classifier: candidate version 4, champion version 3",
        "last runs (MLflow experiment 'hvdflow'):",
        "  2026-11-22 10:31  FINISHED  version 4 (candidate)" + " " * 9 + "val_accuracy 0.9500  "
        "flow run Completed  run r2",
        "  2026-11-22 09:31  FAILED    no model version" + " " * 14 + "run r1",
    ]


@pytest.mark.unit
def test_a_service_that_does_not_answer_is_down_and_one_pointed_elsewhere_says_so():
    from hvdflow.infra.services._process import free_port

    dead = f"http://127.0.0.1:{free_port()}"
    statuses = service_statuses(
        {"s3": {"url": dead}},  # in the state file, but not answering
        {"PREFECT_API_URL": f"{dead}/api", "MLFLOW_TRACKING_URI": "file:./mlruns"},
    )
    assert statuses == [
        ServiceStatus("s3", dead, False),
        ServiceStatus("mlflow", "file:./mlruns", False, "MLFLOW_TRACKING_URI"),
        ServiceStatus("prefect", dead, False, "PREFECT_API_URL"),
    ]


@pytest.mark.integration
def test_status_shows_the_running_tracking_server_its_runs_and_the_champion(
    mlflow_server, tmp_path, monkeypatch, capsys
):
    from mlflow import MlflowClient

    from hvdflow.tasks.train.tags import FLOW_RUN_TAG

    monkeypatch.setenv("HVDFLOW_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("MLFLOW_TRACKING_URI", mlflow_server.tracking_uri)
    for name in ("AWS_ENDPOINT_URL", "PREFECT_API_URL"):
        monkeypatch.delenv(name, raising=False)
    client = MlflowClient(mlflow_server.tracking_uri)
    experiment = client.create_experiment(f"tests-status-{tmp_path.name}")
    model = f"tests-status-{tmp_path.name}"
    client.create_registered_model(model)
    failed = client.create_run(experiment, tags={FLOW_RUN_TAG: "f-1"})
    client.set_terminated(failed.info.run_id, "FAILED")
    good = client.create_run(experiment)
    client.log_metric(good.info.run_id, "val_accuracy", 0.93)
    client.set_terminated(good.info.run_id, "FINISHED")
    version = client.create_model_version(model, "s3://hvdflow/none", run_id=good.info.run_id)
    client.set_registered_model_alias(model, "champion", version.version)

    argv = ["status", "--model", model, "--experiment", f"tests-status-{tmp_path.name}"]
    capsys.readouterr()  # MLflow's own "View run" lines
    assert main(argv) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[2] == (
        f"  MLflow UI          up    {mlflow_server.tracking_uri}  (from MLFLOW_TRACKING_URI)"
    )
    assert lines[3] == "  Prefect UI         down  start it with: hvdflow up"
    assert lines[4] == f"model {model}: champion version {version.version}"
    newest, oldest = lines[6:8]
    assert "FINISHED" in newest and f"version {version.version} (champion)" in newest
    assert "val_accuracy 0.9300" in newest and newest.endswith(f"run {good.info.run_id}")
    assert "FAILED" in oldest and "no model version" in oldest


@pytest.mark.slow
def test_status_after_a_deployed_run_shows_its_flow_run_state_and_champion(
    deployed_pipeline_run, tmp_path, monkeypatch, capsys
):
    from tests.deployments import MODEL

    run = deployed_pipeline_run
    monkeypatch.setenv("HVDFLOW_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("MLFLOW_TRACKING_URI", run.tracking_uri)
    monkeypatch.setenv("PREFECT_API_URL", run.api_url)
    assert main(["status", "--model", MODEL, "--experiment", MODEL]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert f"  Prefect UI         up    {run.ui_url}  (from PREFECT_API_URL)" in lines
    assert f"model {MODEL}: candidate version 1, champion version 1" in lines
    last = lines[-1]
    assert "FINISHED" in last and "version 1 (candidate, champion)" in last
    assert "flow run Completed" in last
