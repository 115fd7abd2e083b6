"""The whole pipeline flow on the real services: SeaweedFS, MLflow over HTTP, Prefect, Spark."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pyarrow.parquet as pq
import pytest
from mlflow import MlflowClient

from hvdflow.flows.prefect.pipeline import PipelineParams, pipeline
from hvdflow.infra.launcher._engines import engine
from hvdflow.infra.storage.object_store import ObjectStore, ObjectStoreConfig
from hvdflow.tasks.config import default_engine
from hvdflow.tasks.train.summary import profile_lines, throughput_lines
from hvdflow.training.tf_profile import host_events, newest_profile, step_breakdown
from tests.helpers import rank_processes, terminate, user_project, wait_for_no_ranks


@pytest.fixture
def tracking(mlflow_server, monkeypatch):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", mlflow_server.tracking_uri)
    return mlflow_server.tracking_uri


def params(tmp_path, np=2, epochs=2, training=None, **launcher) -> PipelineParams:
    return PipelineParams(
        data={"input": str(tmp_path / "digits"), "output": str(tmp_path / "datasets")},
        training={"epochs": epochs, **(training or {})},
        launcher={"np": np, **launcher},
        tracking={"registered_model_name": "tests-flow", "experiment": "tests-flow"},
    )


def task_states(flow_run_id) -> dict[str, str]:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    with get_client(sync_client=True) as client:
        runs = client.read_task_runs(
            flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run_id]))
        )
    return {run.name.rsplit("-", 1)[0]: run.state.name for run in runs}


@pytest.mark.slow
@pytest.mark.current
def test_the_pipeline_end_to_end_and_a_rerun_after_a_failed_training(
    prefect_harness, spark, seaweed, tracking, tmp_path
):
    from prefect.client.orchestration import get_client
    from prefect.settings import PREFECT_LOCAL_STORAGE_PATH, temporary_settings

    # A run whose training fails (no rank reaches hvd.init(), or creates its strategy, in time)
    # after preprocessing and staging finished. The engine is the profile's default.
    failed = pipeline(params(tmp_path, start_timeout_s=0.01), return_state=True)
    assert failed.is_failed()
    start = engine(default_engine()).start_point
    assert f"did not reach {start} within 0.01 s" in str(failed.result(raise_on_failure=False))
    assert wait_for_no_ranks() == []

    # Run again as another worker would: Prefect's local storage elsewhere (empty). The
    # preprocessing and staging results and cache records are in the object store: reused.
    with temporary_settings({PREFECT_LOCAL_STORAGE_PATH: tmp_path / "another-worker"}):
        # Rank 0 profiles ten batches of the first epoch for TensorBoard and MLflow.
        state = pipeline(params(tmp_path, training={"profile_batches": [5, 15]}), return_state=True)
    assert state.is_completed(), state
    summary = state.result()
    states = task_states(summary["flow_run_id"])
    assert states["preprocess"] == "Cached" and states["stage-weights"] == "Cached"
    assert states["train"] == "Completed"

    # The Parquet dataset.
    train = pq.read_table(os.path.join(summary["dataset"], "train"), columns=["label"])
    val = pq.read_table(os.path.join(summary["dataset"], "val"), columns=["label"])
    assert (train.num_rows, val.num_rows) == (summary["train_rows"], summary["val_rows"])
    assert train.num_rows + val.num_rows == 1797
    # The staged object.
    store = ObjectStore(ObjectStoreConfig.from_env())
    assert store.head(summary["weights_uri"])["metadata"]["model"] == "digits_mlp"
    # The MLflow run and the registered version.
    client = MlflowClient(tracking)
    run = client.get_run(summary["mlflow_run_id"])
    assert run.data.params["np"] == "2" and run.data.params["weights_uri"] == summary["weights_uri"]
    assert len(client.get_metric_history(run.info.run_id, "val_accuracy")) == 2
    # TensorFlow's profile: TensorBoard's folder and its step breakdown, of the batches asked.
    profile = client.download_artifacts(run.info.run_id, "profile", str(tmp_path / "profile"))
    shares = step_breakdown(host_events(newest_profile(profile)))
    assert shares["steps"] == 10
    assert run.data.metrics["profile_step_ms"] == pytest.approx(shares["step_ms"])
    assert 0 < run.data.metrics["profile_ops_share"] <= 1
    assert run.data.params["profile_batches"] == "[5, 15]"
    version = client.get_model_version_by_alias("tests-flow", "candidate")
    assert summary["model"] == f"models:/tests-flow/{version.version}"
    assert version.run_id == run.info.run_id
    # Prefect artifacts: the timings table and the summary linking MLflow.
    with get_client(sync_client=True) as prefect:
        timings = prefect.read_latest_artifacts()
    by_key = {a.key: a for a in timings}
    assert "hvdflow-timings" in by_key and "hvdflow-summary" in by_key
    assert summary["mlflow_run_url"] in by_key["hvdflow-summary"].data
    assert "Quarantined inputs: **0**" in by_key["hvdflow-summary"].data
    # Two throughputs, named for what they measure: the training's and the wall clock's.
    assert summary["steady_images_per_s"] == pytest.approx(
        run.data.metrics["steady_images_per_s"], abs=0.05
    )
    for line in throughput_lines(summary, "- "):
        assert line in by_key["hvdflow-summary"].data
    # The profile's breakdown beside them, as the run's metrics hold it.
    assert summary["profile"]["batches"] == [5, 15]
    assert summary["profile"]["step_ms"] == pytest.approx(shares["step_ms"])
    assert summary["profile"]["waiting_in_step"] == pytest.approx(shares["waiting_in_step"])
    (line,) = profile_lines(summary, "- ")
    assert line.startswith("- profile of batches [5, 15) on rank 0: step ")
    assert line in by_key["hvdflow-summary"].data
    progress = by_key["hvdflow-training-progress"]
    assert progress.type == "progress" and progress.data == 100.0
    # The version's page says what produced it.
    described = client.get_model_version("tests-flow", version.version).description
    assert f"- dataset fingerprint: `{run.data.params['dataset_fingerprint']}`" in described
    assert "- np: 2 (2 ranks on the Spark cluster)" in described

    # Caches that cannot lie: the staged weights and the dataset's manifest are deleted behind
    # Prefect's back; the next run makes them again instead of handing the ranks what is gone.
    bucket, key = summary["weights_uri"].removeprefix("s3://").split("/", 1)
    store._client.delete_object(Bucket=bucket, Key=key)
    manifest = Path(summary["dataset"]).parent / "manifest.json"
    manifest.unlink()
    again = pipeline(params(tmp_path, epochs=1), return_state=True)
    assert again.is_completed(), again
    assert store.head(summary["weights_uri"]) is not None
    assert manifest.exists()


def jvms_of(home: str) -> list[str]:
    """Java processes started for the hvdflow home ``home`` (their HVDFLOW_HOME says so)."""
    found = []
    for proc in psutil.process_iter(["name", "pid"]):
        try:
            if proc.info["name"] == "java" and proc.environ().get("HVDFLOW_HOME") == home:
                found.append(f"{proc.pid} {' '.join(proc.cmdline())[:200]}")
        except psutil.Error:
            continue
    return found


@pytest.mark.slow
def test_a_served_deployment_runs_when_triggered_and_stops_its_ranks_when_cancelled(
    seaweed, tracking, tmp_path, prefect_harness
):
    from prefect.client.orchestration import get_client
    from prefect.deployments import run_deployment
    from prefect.settings import PREFECT_API_URL, temporary_settings
    from prefect.states import Cancelling

    from hvdflow.infra.services.local import LocalServices
    from hvdflow.infra.services.prefect_server import PrefectServer

    services = LocalServices(tmp_path / "home")
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    prefect_server = PrefectServer(tmp_path / "home" / "prefect").start()
    api_url = prefect_server.api_url
    env = {
        **os.environ,
        "PREFECT_API_URL": api_url,
        "HVDFLOW_HOME": str(tmp_path / "home"),
        "SPARK_LOCAL_IP": "127.0.0.1",
        # The runner hears of a cancel through a websocket; if that drops, it polls, every 10 s
        # by default, which is the whole budget below.
        "PREFECT_RUNNER_POLL_FREQUENCY": "2",
        # The temporary folders of this process tree, to see that a run leaves none behind.
        "TMPDIR": str(scratch),
    }
    # Served from a folder holding the user's own tasks.py and flows/ (first on sys.path there):
    # hvdflow's modules are hvdflow.tasks and hvdflow.flows, so theirs hide nothing of ours.
    server = subprocess.Popen(
        [sys.executable, "-m", "hvdflow.flows.cli", "serve", "--np", "-1"],
        cwd=user_project(tmp_path / "project"),
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        with temporary_settings({PREFECT_API_URL: api_url}):
            deadline = time.monotonic() + 120
            flow_run = None
            while flow_run is None:
                try:
                    flow_run = run_deployment(
                        "hvdflow-pipeline/hvdflow-pipeline",
                        parameters={"params": params(tmp_path, np=-1, epochs=1).model_dump()},
                        timeout=600,
                    )
                except Exception:
                    if time.monotonic() > deadline or server.poll() is not None:
                        raise
                    time.sleep(2)  # the deployment is not registered yet
        assert flow_run.state.is_completed(), flow_run.state
        assert flow_run.parameters["params"]["training"]["epochs"] == 1  # not the default
        assert flow_run.parameters["params"]["launcher"]["np"] == -1
        # A finished run leaves no temporary folder of ours; its log stays in HVDFLOW_HOME.
        assert sorted(p.name for p in scratch.glob("hvdflow-*")) == []
        assert list((tmp_path / "home" / "logs" / "runs").glob("*/driver.log"))

        # Cancelling a running flow run from Prefect stops every rank within 10 seconds.
        with temporary_settings({PREFECT_API_URL: api_url}):
            long_run = run_deployment(
                "hvdflow-pipeline/hvdflow-pipeline",
                parameters={"params": params(tmp_path, np=-2, epochs=500).model_dump()},
                timeout=0,
            )
            deadline = time.monotonic() + 180
            while len(rank_processes()) < 2:
                assert time.monotonic() < deadline, "the long run never started its ranks"
                time.sleep(0.5)
            # The first run's dataset is cached and these ranks run on the driver: no JVM.
            assert jvms_of(env["HVDFLOW_HOME"]) == []
            with get_client(sync_client=True) as client:
                client.set_flow_run_state(long_run.id, Cancelling(), force=True)
            cancelled_at = time.monotonic()
            left = wait_for_no_ranks(10.0)
            assert left == [], f"ranks alive {time.monotonic() - cancelled_at:.1f} s after cancel"
    finally:
        terminate(server)
        services.down()
        prefect_server.stop()
    assert wait_for_no_ranks() == []
