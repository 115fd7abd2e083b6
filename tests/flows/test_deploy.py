"""`hvdflow deploy`: the three flows on a work pool, run by a worker that has no checkout."""

from __future__ import annotations

import pytest

from hvdflow.flows.params import PipelineParams, ScoreParams


@pytest.mark.unit
def test_the_deployments_load_by_module_path_and_scoring_follows_the_champion():
    from hvdflow.flows.prefect.deploy import deployments
    from hvdflow.flows.prefect.events import CHAMPION_MOVED, MODEL_NAME

    made = deployments(
        PipelineParams(launcher={"np": 3}),
        cron="0 3 * * *",
        bench_cron=None,
        score_params=ScoreParams(data={"input": "s3://images/incoming"}),
        score_on_champion=True,
    )
    by_name = {d.name: d for d in made}
    assert {name: d.entrypoint for name, d in by_name.items()} == {
        "hvdflow-pipeline": "hvdflow.flows.prefect.pipeline.pipeline",
        "hvdflow-benchmark": "hvdflow.flows.prefect.benchmark.benchmark",
        "hvdflow-score": "hvdflow.flows.prefect.scoring.score",
    }
    assert by_name["hvdflow-pipeline"].parameters["params"]["launcher"]["np"] == 3
    assert [s.schedule.cron for s in by_name["hvdflow-pipeline"].schedules] == ["0 3 * * *"]
    assert by_name["hvdflow-benchmark"].schedules == []
    (trigger,) = by_name["hvdflow-score"].triggers
    assert trigger.expect == {CHAMPION_MOVED}
    assert trigger.match.model_dump()[MODEL_NAME] == "hvdflow-classifier"
    version = trigger.parameters["params"]["model"]["version"]
    assert version == "{{ event.resource['hvdflow.model.version'] }}"
    assert trigger.parameters["params"]["data"]["input"] == "s3://images/incoming"

    with pytest.raises(ValueError, match="--score-input"):
        deployments(PipelineParams(), cron=None, bench_cron=None, score_on_champion=True)


@pytest.mark.unit
def test_the_job_variables_refuse_a_loopback_service_unless_on_the_hosts_network():
    from hvdflow.flows.prefect.docker_pool import DockerPoolError, job_variables

    env = {"MLFLOW_TRACKING_URI": "http://127.0.0.1:5000"}
    with pytest.raises(DockerPoolError) as refused:
        job_variables("hvdflow:classic", "hvdflow-net", env)
    message = str(refused.value)
    assert message.startswith("MLFLOW_TRACKING_URI=http://127.0.0.1:5000 is this machine's")
    assert "network 'hvdflow-net'" in message and "--network host" in message
    on_host = job_variables("hvdflow:classic", "host", env)
    assert on_host["network_mode"] == "host" and on_host["env"] == env
    bridged = job_variables("hvdflow:classic", "hvdflow-net", {"AWS_DEFAULT_REGION": "eu"})
    assert bridged["networks"] == ["hvdflow-net"] and "network_mode" not in bridged


@pytest.mark.slow
def test_a_worker_without_a_checkout_runs_the_pipeline_scoring_on_its_champion_and_the_benchmark(
    deployed_pipeline_run,
):
    from mlflow import MlflowClient
    from prefect.client.orchestration import get_client
    from prefect.settings import PREFECT_API_URL, temporary_settings

    from hvdflow.tasks.train.tags import FLOW_RUN_TAG
    from tests.deployments import MODEL

    run = deployed_pipeline_run
    for name in ("hvdflow-pipeline", "hvdflow-benchmark", "hvdflow-score"):
        assert f"{name}/{name}" in run.deploy_output
    log = run.worker_log.read_text()[-4000:]
    assert run.flow_run.state.is_completed(), f"{run.flow_run.state}\n{log}"
    assert run.flow_run.parameters == run.parameters  # not the deployment's np=2 and 5 epochs
    with temporary_settings({PREFECT_API_URL: run.api_url}), get_client(sync_client=True) as c:
        deployment = c.read_deployment(run.flow_run.deployment_id)
    assert deployment.entrypoint == "hvdflow.flows.prefect.pipeline.pipeline"
    assert not deployment.pull_steps  # nothing to pull: the worker has hvdflow installed
    assert deployment.work_pool_name == "hvdflow"
    # Runs in the worker's folder: no temporary folder per run for a killed worker to leave.
    assert deployment.job_variables == {"working_dir": "."}
    assert [s.schedule.cron for s in deployment.schedules] == ["0 3 * * *"]
    assert deployment.parameters["params"]["training"]["epochs"] == 5
    # Neither folder got anything: no checkout was needed where `deploy` or the worker ran.
    assert [sorted(p.name for p in folder.iterdir()) for folder in run.folders] == [[], []]

    # The run trained what the API asked for, in an MLflow run that names its flow run.
    client = MlflowClient(run.tracking_uri)
    (mlflow_run,) = client.search_runs(
        [client.get_experiment_by_name(MODEL).experiment_id],
        f"tags.`{FLOW_RUN_TAG}` = '{run.flow_run.id}'",
    )
    assert mlflow_run.data.params["epochs"] == "2" and mlflow_run.data.params["np"] == "-1"
    assert len(client.get_metric_history(mlflow_run.info.run_id, "val_accuracy")) == 2

    # Its version became champion; the event started the scoring deployment with that version.
    champion = client.get_model_version_by_alias(MODEL, "champion")
    assert champion.run_id == mlflow_run.info.run_id
    assert run.score_run is not None, f"no scoring run followed the new champion\n{log}"
    assert run.score_run.state.is_completed(), f"{run.score_run.state}\n{log}"
    model = run.score_run.parameters["params"]["model"]
    assert (model["name"], model["version"]) == (MODEL, champion.version)

    assert run.bench_run.state.is_completed(), f"{run.bench_run.state}\n{log}"
    # Stopping the worker left nothing running: not it, a flow run, Spark, or a rank.
    assert run.left_alive == []
    # The worker stopped on SIGTERM, not SIGKILLed at the timeout: a test run from a background
    # job ignores SIGINT, which a Prefect worker needs to stop (infra/services/_process.py).
    assert run.worker_exit == 0, f"the worker exited with {run.worker_exit}\n{log}"
