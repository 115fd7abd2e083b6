"""The pipeline as Airflow DAGs, against a real Airflow: the example DAG file copied into a fresh
Airflow's dags folder, the pipeline triggered through Airflow's REST API, the scoring DAG run by
the champion's asset event, and the UI's grid in headless Chromium.

Airflow runs from its own environment (.venv-airflow: Airflow 3.3 and hvdflow without its
dependencies, as docs/airflow.md installs it); the tasks run in this one (HVDFLOW_PYTHON).
"""

from __future__ import annotations

import socket
import sys
import uuid
from contextlib import contextmanager

import pytest

from tests.airflow_harness import Airflow, require_airflow
from tests.connect_client import needs_connect_client
from tests.tasks.score.helpers import write_digits

pytestmark = pytest.mark.slow

PIPELINE, SCORE = "hvdflow_pipeline", "hvdflow_score"
MODEL = "hvdflow-classifier"  # the example DAG file's: the factories' default
# Non-default parameters, as a person types them into the trigger form.
FORM = {"np": 2, "epochs": 2, "params": {"training": {"batch_size": 16, "seed": 7}}}
# The same run as nested parameters, for the Prefect flow.
NESTED = {"launcher": {"np": 2}, "training": {"epochs": 2, "batch_size": 16, "seed": 7}}
CARD_TAGS = ("hvdflow.dataset_fingerprint", "hvdflow.np", "hvdflow.engine")
HELD_OUT = range(1500, 1530)
# Airflow's default port for the scheduler's log server, which another Airflow may hold.
DEFAULT_LOG_SERVER_PORT = 8793


@pytest.fixture
def own_tracking_server(seaweed, tmp_path):
    """A tracking server of this test's own: a fresh registry, where the first version the
    pipeline registers becomes champion whatever other tests registered."""
    from hvdflow.infra.services.mlflow_server import MlflowServer

    server = MlflowServer(
        tmp_path / "mlflow", f"s3://hvdflow-mlflow/airflow-{uuid.uuid4().hex[:8]}", seaweed.env()
    ).start()
    try:
        yield server
    finally:
        server.stop()


@contextmanager
def started_airflow(tmp_path, env: dict[str, str], without: tuple[str, ...] = ()):
    """Airflow with the example DAG file in its dags folder, as docs/airflow.md puts it there, its
    tasks seeing ``env`` on top of this environment, less ``without``; held-out digits for the
    scoring DAG."""
    require_airflow()
    heldout = tmp_path / "heldout"
    write_digits(heldout, HELD_OUT, bad=False)
    server = Airflow(
        tmp_path / "airflow",
        {
            "HVDFLOW_HOME": str(tmp_path / "hvdflow"),
            "HVDFLOW_SCORE_INPUT": str(heldout),
            "SPARK_LOCAL_IP": "127.0.0.1",
            **env,
        },
    )
    for name in without:
        server.env.pop(name, None)
    server.write_example_dags()
    # Held as another Airflow on the machine would hold it: this one's log server goes elsewhere.
    with _held_if_free(DEFAULT_LOG_SERVER_PORT):
        server.start()
        try:
            yield server
        finally:
            left = server.stop()
            assert not left, f"Airflow processes left running: {left}"
    scheduler_log = (server.home / "scheduler.log").read_text(errors="replace")
    assert "error while attempting to bind" not in scheduler_log


@contextmanager
def _held_if_free(port: int):
    """``port`` listened on by this process meanwhile, when nothing else holds it already."""
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("0.0.0.0", port))
            sock.listen()
        except OSError:
            pass  # held by another program: the same for the Airflow that starts now
        yield


@pytest.fixture
def airflow(own_tracking_server, seaweed, tmp_path):
    """Airflow whose tasks run in this environment (HVDFLOW_PYTHON), on local[N]."""
    env = {**seaweed.env(), **own_tracking_server.env(), "HVDFLOW_PYTHON": sys.executable}
    with started_airflow(tmp_path, env) as server:
        yield server


@pytest.mark.timeout(900)
def test_the_pipeline_dag_registers_a_champion_that_the_scoring_dag_scores_with(
    airflow, own_tracking_server, prefect_harness, tmp_path, monkeypatch
):
    from mlflow import MlflowClient
    from pydantic import ValidationError

    from hvdflow.flows.airflow.form import nested_values
    from hvdflow.flows.cli_support import describe_validation_error
    from hvdflow.flows.params import PipelineParams

    assert nested_values(FORM) == NESTED  # the form and `hvdflow run --params` say the same
    airflow.wait_for_dag(PIPELINE)
    airflow.wait_for_dag(SCORE)
    providers = airflow.get("/api/v2/providers")["providers"]
    assert "hvdflow" in [p["package_name"] for p in providers]

    # A bad value fails the first task, once, with the line `hvdflow run` would print.
    bad = airflow.trigger(PIPELINE, {**FORM, "epochs": 0})
    assert airflow.wait_for_run(PIPELINE, bad, 120)["state"] == "failed"
    states = airflow.task_states(PIPELINE, bad)
    assert states["validate"] == "failed", states
    assert states["train"] != "success"
    with pytest.raises(ValidationError) as refused:
        PipelineParams.model_validate(nested_values({**FORM, "epochs": 0}))
    expected = describe_validation_error(PipelineParams, refused.value)
    assert expected.startswith("invalid parameter training.epochs=0")
    assert expected in airflow.task_log(PIPELINE, bad, "validate")

    # The pipeline with the form's non-default values: every task succeeds.
    good = airflow.trigger(PIPELINE, FORM)
    run = airflow.wait_for_run(PIPELINE, good, 600)
    states = airflow.task_states(PIPELINE, good)
    assert run["state"] == "success", states
    assert set(states.values()) == {"success"}, states
    trained = airflow.xcom(PIPELINE, good, "train")
    assert "champion" in trained["aliases"] and trained["model_version"] == "1"
    # The same summary as the Prefect flow's: the DAG run, the links, both throughputs.
    assert (
        trained["flow_run_id"] == f"{PIPELINE}/{good}" and trained["model"] == f"models:/{MODEL}/1"
    )
    assert trained["mlflow_run_url"].endswith(f"/runs/{trained['mlflow_run_id']}")
    assert trained["steady_images_per_s"] > 0 and trained["dataset"]
    # Rank output, rank-prefixed, in the train task's log; the throughput words after it.
    log = airflow.task_log(PIPELINE, good, "train")
    assert "[1,0]<" in log and "[1,1]<" in log, log[-3000:]
    assert "training throughput (steady state)" in log, log[-3000:]

    client = MlflowClient(own_tracking_server.tracking_uri)
    version = client.get_model_version(MODEL, "1")
    tags = version.tags
    assert tags["hvdflow.orchestrator"] == "airflow"
    assert tags["hvdflow.flow_run_id"] == f"{PIPELINE}/{good}"
    assert tags["hvdflow.np"] == "2" and float(tags["hvdflow.val_accuracy"]) > 0.5
    assert f"Airflow DAG run: [{PIPELINE}/{good}]({airflow.url}/dags/{PIPELINE}/runs/" in (
        version.description
    )
    mlflow_run = client.get_run(trained["mlflow_run_id"])
    assert mlflow_run.data.params["epochs"] == "2"
    assert mlflow_run.data.params["batch_size"] == "16"

    # Scoring ran on the asset event, with exactly the version it named.
    scoring = _asset_triggered_run(airflow)
    assert scoring["state"] == "success", airflow.task_states(SCORE, scoring["dag_run_id"])
    scored = airflow.xcom(SCORE, scoring["dag_run_id"], "score")
    assert scored["model_version"] == "1" and scored["scored"] == len(HELD_OUT)
    assert scored["flow_run_id"] == f"{SCORE}/{scoring['dag_run_id']}"

    # The same parameters through the Prefect flow give the same card, except the run link.
    from hvdflow.flows.prefect.pipeline import pipeline

    monkeypatch.setenv("MLFLOW_TRACKING_URI", own_tracking_server.tracking_uri)
    monkeypatch.setenv("HVDFLOW_HOME", airflow.env["HVDFLOW_HOME"])
    summary = pipeline(PipelineParams.model_validate(NESTED))
    prefect_tags = client.get_model_version(MODEL, summary["model"].rsplit("/", 1)[1]).tags
    for key in CARD_TAGS:
        assert prefect_tags[key] == tags[key], key
    assert "hvdflow.val_accuracy" in prefect_tags
    assert prefect_tags["hvdflow.orchestrator"] == "prefect"

    _see_the_grid(airflow, good)


def _asset_triggered_run(airflow: Airflow) -> dict:
    """The scoring DAG's run that the champion's asset event started, once finished."""
    import time

    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        runs = [r for r in airflow.runs(SCORE) if r["run_type"] == "asset_triggered"]
        if runs:
            return airflow.wait_for_run(SCORE, runs[-1]["dag_run_id"], 300)
        time.sleep(2)
    raise AssertionError(f"no asset-triggered run of {SCORE}: {airflow.runs(SCORE)}")


def _see_the_grid(airflow: Airflow, run_id: str) -> None:
    """The pipeline's grid view in headless Chromium shows the run's tasks."""
    from tests.ui.conftest import CHROMIUM, LAUNCH_ARGS, require_browser, screenshot

    require_browser()
    from playwright.sync_api import expect, sync_playwright

    args = [*LAUNCH_ARGS, *(["--no-sandbox"] if __import__("os").geteuid() == 0 else [])]
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, headless=True, args=args)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            page.set_default_timeout(60_000)
            page.goto(f"{airflow.url}/dags/{PIPELINE}/runs/{run_id}")
            for task_id in ("validate", "preprocess", "train", "register"):
                expect(page.get_by_text(task_id, exact=True).first).to_be_visible(timeout=60_000)
            screenshot(page, "airflow-pipeline-grid")
        finally:
            browser.close()


@pytest.mark.current
@needs_connect_client
@pytest.mark.timeout(900)
def test_the_dags_run_through_spark_connect_from_a_thin_worker(
    connect_server, own_tracking_server, seaweed, tmp_path
):
    """Airflow's tasks in the thin worker's environment (.venv-client: pyspark-client, no
    TensorFlow, no Java on the PATH), Spark through a Connect server (SPARK_REMOTE, and the
    form's spark_master): the pipeline registers a champion and its asset event scores."""
    from tests.connect_client import path_without_java
    from tests.uv import CHECKOUT

    images = tmp_path / "images"  # the thin worker has no scikit-learn for the bundled digits
    write_digits(images, range(0, 500))
    env = {
        **seaweed.env(),
        **own_tracking_server.env(),
        "HVDFLOW_PYTHON": str(CHECKOUT / ".venv-client" / "bin" / "python"),
        "SPARK_REMOTE": connect_server.url,
        "PATH": path_without_java(tmp_path / "bin"),
    }
    with started_airflow(tmp_path, env, without=("JAVA_HOME",)) as airflow:
        airflow.wait_for_dag(PIPELINE)
        form = {
            "np": 2,
            "epochs": 2,
            "input": str(images),
            "input_format": "folders",
            "spark_master": connect_server.url,
        }
        good = airflow.trigger(PIPELINE, form)
        run = airflow.wait_for_run(PIPELINE, good, 600)
        states = airflow.task_states(PIPELINE, good)
        tail = airflow.task_log(PIPELINE, good, "train")[-3000:]
        assert run["state"] == "success", (states, tail)
        assert "initial weights in a Spark task (Spark Connect)" in airflow.task_log(
            PIPELINE, good, "stage_weights"
        )
        log = airflow.task_log(PIPELINE, good, "train")
        assert "[1,0]<" in log and "[1,1]<" in log, log[-3000:]
        trained = airflow.xcom(PIPELINE, good, "train")
        assert "champion" in trained["aliases"] and trained["model_version"] == "1"
        scoring = _asset_triggered_run(airflow)
        assert scoring["state"] == "success", airflow.task_states(SCORE, scoring["dag_run_id"])
        scored = airflow.xcom(SCORE, scoring["dag_run_id"], "score")
        assert scored["model_version"] == "1" and scored["scored"] == len(HELD_OUT)
