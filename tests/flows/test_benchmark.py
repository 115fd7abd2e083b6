"""A small benchmark run on the real services: table, statistics and plots produced and logged."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from mlflow import MlflowClient

from hvdflow.bench.conditions import Measurement
from hvdflow.bench.stats import anova, summary_table, tukey_against
from hvdflow.flows.prefect.benchmark import BenchParams, benchmark, plots_markdown
from hvdflow.infra import extras
from hvdflow.infra.storage.object_store import ObjectStore, ObjectStoreConfig
from tests.helpers import wait_for_no_ranks


@pytest.mark.slow
@pytest.mark.current
def test_a_small_benchmark_produces_and_logs_table_statistics_and_plots(
    prefect_harness, spark, seaweed, mlflow_server, tmp_path, monkeypatch
):
    from prefect.client.orchestration import get_client

    monkeypatch.setenv("MLFLOW_TRACKING_URI", mlflow_server.tracking_uri)
    # One rank of Horovod where it is installed (classic), of TensorFlow's collectives where not.
    one = "hvd1" if extras.installed(extras.HOROVOD) else "tf1"
    params = BenchParams(
        data={
            "input": str(tmp_path / "digits"),
            "input_format": "digits",
            "output": str(tmp_path / "datasets"),
            "image_size": (8, 8),
        },
        training={
            "model": "digits_mlp",
            "epochs": 2,
            "batch_size": 32,
            "optimizer": "adam",
            "learning_rate": 0.01,
            "weights_source": "keras:weights=None",  # staged once, loaded by every condition
        },
        # Both engines and the machine's ceiling, twice each (Tukey needs repetitions).
        conditions=["ceiling2", one, "tf2"],
        repetitions=2,
        target_accuracy=0.5,
        experiment="tests-bench",
    )
    result = benchmark(params)

    rows = {r["condition"]: r for r in result["rows"]}
    assert list(rows) == ["ceiling2", one, "tf2"]
    assert "| tf2 | 2 x 1 |" in result["table"] and f"| {one} | 1 x 1 |" in result["table"]
    # The table is the statistics of what was measured, nothing else: recompute it exactly.
    out_dir = Path(result["plots"][0]).parent
    measured = [Measurement(**m) for m in json.loads((out_dir / "measurements.json").read_text())]
    assert summary_table(measured, target=0.5) == result["rows"]
    # Every condition learned the digits and says when it got there, launch included.
    # Evaluated every tenth of an epoch (the study's default): the time to the target is the
    # first of those evaluations that reached it, as the driver's log showed it.
    for m in measured:
        assert len(m.val_accuracy) == 2 and m.final_val_accuracy > 0.5
        assert len(m.epoch_done_s) == 2
        assert len(m.evaluations) >= 2 * 9  # about ten an epoch, the last after its last step
        images = [e[1] for e in m.evaluations]
        assert images == sorted(set(images))  # each once, in the order they were trained
        assert images[-1] == m.images // (m.processes if m.kind == "ceiling" else 1)
        reached = next(e for e in m.evaluations if e[2] >= 0.5)
        assert m.seconds_to(0.5) == reached[0] <= m.wall_clock_s
        assert m.images_to(0.5) == reached[1]
        assert m.evaluation_share > 0  # measured (on so small a workload, not a small share)
    paired = {r["condition"]: r for r in result["time_to_target"]}
    assert paired["tf2"]["paired_rounds"] == 2 and 0 <= paired["tf2"]["first_in"] <= 2
    assert paired[one]["times_s"] == [m.seconds_to(0.5) for m in measured if m.condition == one]
    assert "first in (rounds vs" in result["table"]
    assert rows[one]["time_to_target_s"] is not None and rows[one]["reached_target"] == 2
    assert list(anova(measured)) == pytest.approx(list(result["anova"]))
    assert rows["tf2"]["tukey_p"] == tukey_against(measured, one)["tf2"]
    assert [(m.condition, m.repetition) for m in measured] == [
        (c, r)
        for r in (0, 1)
        for c in ("ceiling2", one, "tf2")  # interleaved rounds
    ]
    # Every process trained the same images per epoch: whole batches of 32 of its share.
    train_rows = result["dataset"]["train_rows"]
    per_process = {m.condition: m.images // (2 * m.processes) for m in measured}
    assert per_process[one] == (train_rows // 32) * 32
    assert per_process["tf2"] == (train_rows // 2 // 32) * 32
    assert per_process["ceiling2"] == (train_rows // 32) * 32
    assert all(len(m.epoch_times) == 2 and m.threads == 1 for m in measured)

    store = ObjectStore(ObjectStoreConfig.from_env())
    assert store.list_keys(store.config.key("weights", "digits_mlp"))  # staged once

    client = MlflowClient(mlflow_server.tracking_uri)
    logged = {a.path for a in client.list_artifacts(result["mlflow_run_id"], "benchmark")}
    assert logged == {
        "benchmark/images_per_s.png",
        "benchmark/scaling_efficiency.png",
        "benchmark/time_to_target.png",
        "benchmark/accuracy_over_time.png",
        "benchmark/table.md",
        "benchmark/measurements.json",
    }
    metrics = client.get_run(result["mlflow_run_id"]).data.metrics
    assert metrics["tf2_images_per_s"] == pytest.approx(rows["tf2"]["images_per_s"])
    assert metrics["tf2_scaling_efficiency"] == pytest.approx(rows["tf2"]["scaling_efficiency"])
    assert metrics["anova_p"] == pytest.approx(result["anova"][1])
    assert metrics["tf2_time_to_target_s"] == pytest.approx(rows["tf2"]["time_to_target_s"])
    assert metrics["tf2_val_accuracy"] == pytest.approx(rows["tf2"]["val_accuracy"])
    # Each round's evaluations in the run's charts, at the images trained.
    second = next(m for m in measured if m.condition == "tf2" and m.repetition == 1)
    history = client.get_metric_history(result["mlflow_run_id"], "tf2_r2_interval_val_accuracy")
    assert sorted((h.step, h.value) for h in history) == [
        (int(e[1]), pytest.approx(e[2])) for e in second.evaluations
    ]
    with get_client(sync_client=True) as prefect:
        by_key = {a.key: a for a in prefect.read_latest_artifacts()}
    assert {"hvdflow-benchmark-table", "hvdflow-benchmark-summary"} <= set(by_key)
    # The plots themselves are in the flow run's summary, the same bytes as in MLflow.
    summary = by_key["hvdflow-benchmark-summary"].data
    for name in ("images_per_s", "scaling_efficiency"):
        png = Path(
            client.download_artifacts(
                result["mlflow_run_id"], f"benchmark/{name}.png", str(tmp_path / "plots")
            )
        )
        assert plots_markdown([png]) in summary
    assert wait_for_no_ranks() == []


@pytest.mark.unit
def test_the_plots_are_embedded_in_the_markdown_as_data_uris(tmp_path):
    import base64
    import re

    png = tmp_path / "images_per_s.png"
    png.write_bytes(b"\x89PNG\r\n\x1a\n not really")
    markdown = plots_markdown([png, png])
    found = re.findall(r"!\[images per s\]\(data:image/png;base64,([A-Za-z0-9+/=]+)\)", markdown)
    assert [base64.b64decode(b) for b in found] == [png.read_bytes()] * 2


@pytest.mark.unit
def test_a_changed_setting_keeps_the_rest_of_the_studys_setup():
    params = BenchParams.model_validate({"training": {"epochs": 3}, "data": {"val_fraction": 0.1}})
    training = params.training
    assert (training.model, training.batch_size, training.optimizer) == (
        "mnist_cnn",
        128,
        "adadelta",
    )
    assert training.epochs == 3 and training.learning_rate == 1.0
    assert params.data.image_size == (28, 28) and params.data.val_fraction == 0.1


@pytest.mark.unit
def test_another_optimizer_brings_its_own_rate_not_adadeltas():
    adam = BenchParams.model_validate({"training": {"optimizer": "adam"}}).training
    assert (adam.optimizer, adam.learning_rate, adam.batch_size) == ("adam", 0.001, 128)
    given = BenchParams.model_validate({"training": {"optimizer": "sgd", "learning_rate": 0.1}})
    assert given.training.learning_rate == 0.1
