"""The training summary that every face returns: plain values, no login, the throughput words."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from hvdflow.tasks.config import TrackingParams, TrainingParams
from hvdflow.tasks.train.config import TrainConfig
from hvdflow.tasks.train.origin import RunOrigin
from hvdflow.tasks.train.run import TrainResult
from hvdflow.tasks.train.summary import profile_lines, throughput_lines, training_summary

pytestmark = pytest.mark.unit


def _result(**changes) -> TrainResult:
    values = {
        "run_id": "r1",
        "experiment_id": "7",
        "tracking_uri": "http://alice:s3cret@mlflow.example:5000/",
        "model_version": "3",
        "aliases": ["champion"],
        "wall_clock_s": 23.34,
        "images_per_s": 121.06,
        "epoch_times": [1.0, 0.5],
        "epoch_times_log": [1.0, 0.5],
        "history": {"val_accuracy": [0.8, 0.93]},
        "attempts": 2,
    }
    return TrainResult(**{**values, **changes})


CONFIG = TrainConfig(tracking=TrackingParams(registered_model_name="clf"))
# What a summary reads of the run's DatasetManifest.
DATASET = SimpleNamespace(path="s3://b/digits/abc", train_rows=1437, val_rows=360, quarantined=2)


def test_a_summary_links_the_run_and_version_without_the_login():
    origin = RunOrigin("airflow", "dag/run-1", "Airflow DAG run", "http://af/dags/dag/runs/run-1")
    metrics = {"steady_images_per_s": 2498.94}
    summary = training_summary(_result(), CONFIG, dataset=DATASET, metrics=metrics, origin=origin)
    assert "s3cret" not in repr(summary)
    base = "http://mlflow.example:5000"
    assert summary["mlflow_run_url"] == f"{base}/#/experiments/7/runs/r1"
    assert summary["model"] == "models:/clf/3"
    assert summary["model_url"] == f"{base}/#/models/clf/versions/3"
    assert summary["champion_moved"] and summary["attempts"] == 2
    assert (summary["flow_run_id"], summary["flow_run_url"]) == (origin.run_id, origin.url)
    assert (summary["train_rows"], summary["val_rows"], summary["quarantined"]) == (1437, 360, 2)
    assert summary["steady_images_per_s"] == 2498.9 and summary["images_per_s"] == 121.1
    assert summary["val_accuracy"] == 0.93 and summary["weights_uri"] is None
    # No profile was asked for: the metrics of an earlier attempt's profile are not reported.
    assert summary["profile"] is None


def test_a_summary_reports_the_profile_only_when_this_training_asked_for_one():
    metrics = {"profile_step_ms": 140.3, "profile_ops_share": 0.893}
    profiled = CONFIG.model_copy(update={"training": TrainingParams(profile_batches=(20, 40))})
    assert training_summary(_result(), CONFIG, metrics=metrics)["profile"] is None
    profile = training_summary(_result(), profiled, metrics=metrics)["profile"]
    assert profile["batches"] == [20, 40] and profile["ops"] == 0.893


def test_a_summary_without_a_version_or_an_http_server_says_so_plainly():
    result = _result(model_version=None, aliases=[], tracking_uri="file:///tmp/mlruns")
    summary = training_summary(result, CONFIG, metrics={})
    assert summary["model"] is None and summary["model_url"] is None
    assert not summary["champion_moved"]
    assert summary["mlflow_run_url"] == "r1"
    assert summary["steady_images_per_s"] is None and summary["dataset"] is None


def test_the_summary_names_each_throughput_for_what_it_measures():
    summary = {"steady_images_per_s": 2498.9, "images_per_s": 121.1, "wall_clock_s": 23.3}
    assert throughput_lines(summary) == [
        "training throughput (steady state): 2498.9 images/s (epochs after the first)",
        "wall clock incl. launch: 121.1 images/s, 23.3 s",
    ]
    assert throughput_lines({**summary, "steady_images_per_s": None}) == [
        "wall clock incl. launch: 121.1 images/s, 23.3 s"
    ]


def test_the_summary_says_where_a_profiled_step_went():
    shares = {"step_ms": 140.3, "ops": 0.893, "input": 0.001, "waiting_in_step": 0.101}
    profile = {"batches": [20, 40], **shares, "between_steps": 0.005}
    assert profile_lines({"profile": profile}) == [
        "profile of batches [20, 40) on rank 0: step 140.3 ms, ops running 89%, input 0%, "
        "waiting for allreduces 10%, between steps 0% (the MLflow run's artifacts, profile/; "
        "TensorBoard's Profile tab reads a download)"
    ]
    # No profile asked: the summary says nothing of one.
    assert profile_lines({"profile": None}) == []
