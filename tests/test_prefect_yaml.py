"""prefect.yaml: the deployments Prefect's own tools deploy (`prefect deploy --all`) and a process
worker runs (`prefect worker start --pool hvdflow`)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from hvdflow.flows.params import BenchParams, PipelineParams

ROOT = Path(__file__).resolve().parent.parent


def prefect_yaml() -> dict:
    return yaml.safe_load((ROOT / "prefect.yaml").read_text())


@pytest.mark.unit
def test_prefect_yaml_deploys_both_flows_to_the_process_pool_with_valid_parameters():
    config = prefect_yaml()
    deployments = {d["name"]: d for d in config["deployments"]}
    assert set(deployments) == {"hvdflow-pipeline", "hvdflow-benchmark"}
    expected = {
        "hvdflow-pipeline": ("flows/pipeline.py:pipeline", PipelineParams, "0 3 * * *"),
        "hvdflow-benchmark": ("flows/benchmark.py:benchmark", BenchParams, "0 4 * * 0"),
    }
    for name, (entrypoint, model, cron) in expected.items():
        deployment = deployments[name]
        assert deployment["entrypoint"] == entrypoint
        path, function = entrypoint.split(":")
        assert f"def {function}(" in (ROOT / path).read_text()
        model.model_validate(deployment["parameters"]["params"])  # what a scheduled run gets
        assert [s["cron"] for s in deployment["schedules"]] == [cron]
        assert deployment["work_pool"]["name"] == "hvdflow"
        assert deployment["concurrency_limit"] == 1
    # Each run starts in the folder `prefect deploy` ran in: a build step's output, not a path
    # written into the file.
    (build,) = config["build"]
    step_id = build["prefect.deployments.steps.run_shell_script"]["id"]
    (pull,) = config["pull"]
    directory = pull["prefect.deployments.steps.set_working_directory"]["directory"]
    assert directory == f"{{{{ {step_id}.stdout }}}}"


@pytest.mark.slow
def test_deploy_all_then_a_worker_runs_the_pipeline_with_the_parameters_given_through_the_api(
    deployed_pipeline_run,
):
    from mlflow import MlflowClient
    from prefect.client.orchestration import get_client
    from prefect.settings import PREFECT_API_URL, temporary_settings

    from hvdflow.tasks.train.tags import FLOW_RUN_TAG
    from tests.deployments import MODEL

    run = deployed_pipeline_run
    assert "hvdflow-pipeline/hvdflow-pipeline" in run.deploy_output
    assert "hvdflow-benchmark/hvdflow-benchmark" in run.deploy_output
    assert run.flow_run.state.is_completed(), (
        f"{run.flow_run.state}\n{run.worker_log.read_text()[-4000:]}"
    )
    assert run.flow_run.parameters == run.parameters  # not prefect.yaml's np=2 and 5 epochs
    with temporary_settings({PREFECT_API_URL: run.api_url}), get_client(sync_client=True) as c:
        deployment = c.read_deployment(run.flow_run.deployment_id)
        bench = c.read_deployment_by_name("hvdflow-benchmark/hvdflow-benchmark")
    assert deployment.name == "hvdflow-pipeline" and deployment.work_pool_name == "hvdflow"
    assert [s.schedule.cron for s in deployment.schedules] == ["0 3 * * *"]
    assert deployment.parameters["params"]["training"]["epochs"] == 5
    assert [s.schedule.cron for s in bench.schedules] == ["0 4 * * 0"]
    assert deployment.pull_steps == [
        {"prefect.deployments.steps.set_working_directory": {"directory": str(ROOT)}}
    ]

    # The run trained what the API asked for, in an MLflow run that names its flow run.
    client = MlflowClient(run.tracking_uri)
    (mlflow_run,) = client.search_runs(
        [client.get_experiment_by_name(MODEL).experiment_id],
        f"tags.`{FLOW_RUN_TAG}` = '{run.flow_run.id}'",
    )
    assert mlflow_run.data.params["epochs"] == "2" and mlflow_run.data.params["np"] == "-1"
    assert len(client.get_metric_history(mlflow_run.info.run_id, "val_accuracy")) == 2
    assert mlflow_run.data.metrics["steady_images_per_s"] > 0
    # Stopping the worker left nothing running: not it, the flow run, Spark, or a rank.
    assert run.left_alive == []
