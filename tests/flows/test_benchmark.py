"""A small benchmark run on the real services: table, statistics and plots produced and logged."""

from __future__ import annotations

import pytest
from mlflow import MlflowClient

from flows.benchmark import BenchParams, benchmark
from infra.object_store import ObjectStore, ObjectStoreConfig
from tests.helpers import wait_for_no_ranks


@pytest.mark.slow
def test_a_small_benchmark_produces_and_logs_table_statistics_and_plots(
    prefect_harness, spark, seaweed, mlflow_server, tmp_path, monkeypatch
):
    from prefect.client.orchestration import get_client

    monkeypatch.setenv("MLFLOW_TRACKING_URI", mlflow_server.tracking_uri)
    params = BenchParams(
        model="digits_mlp",
        input=str(tmp_path / "digits"),
        output=str(tmp_path / "datasets"),
        image_size=(8, 8),
        conditions=["keras", "1"],
        repetitions=1,
        epochs=2,
        optimizer="adam",
        learning_rate=0.01,
        experiment="tests-bench",
        weights_source="keras:weights=None",  # staged once, loaded by every condition
    )
    result = benchmark(params)

    rows = {r["condition"]: r for r in result["rows"]}
    assert set(rows) == {"keras", "np=1"}
    assert rows["np=1"]["scaling_efficiency"] == pytest.approx(1.0)
    assert rows["keras"]["tukey_p_vs_np1"] is not None
    assert 0.0 <= result["anova"][1] <= 1.0
    assert all(r["images_per_s"] > 0 and r["epoch_time_log_mean_s"] for r in result["rows"])
    assert "| keras |" in result["table"] and "| np=1 |" in result["table"]

    store = ObjectStore(ObjectStoreConfig.from_env())
    assert store.list_keys(store.config.key("weights", "digits_mlp"))  # staged once

    client = MlflowClient(mlflow_server.tracking_uri)
    logged = {a.path for a in client.list_artifacts(result["mlflow_run_id"], "benchmark")}
    assert logged == {
        "benchmark/images_per_s.png",
        "benchmark/scaling_efficiency.png",
        "benchmark/table.md",
        "benchmark/measurements.json",
    }
    metrics = client.get_run(result["mlflow_run_id"]).data.metrics
    assert metrics["np1_scaling_efficiency"] == pytest.approx(1.0)
    assert "anova_p" in metrics and metrics["keras_images_per_s"] > 0
    with get_client(sync_client=True) as prefect:
        keys = {a.key for a in prefect.read_latest_artifacts()}
    assert {"hvdflow-benchmark-table", "hvdflow-benchmark-summary"} <= keys
    assert wait_for_no_ranks() == []
