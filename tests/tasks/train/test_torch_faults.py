"""A PyTorch training's faults through the pipeline's training step: a rank SIGKILLed mid-way is
run again by ``launcher.retries`` from the last checkpoint, in the same MLflow run."""

from __future__ import annotations

import pytest
from mlflow import MlflowClient

from hvdflow.tasks.train.run import TrainConfig, train_and_track
from tests.helpers import wait_for_no_ranks
from tests.tasks.train.test_faults import EPOCH_METRICS, kill_rank_when

pytestmark = [pytest.mark.slow, pytest.mark.torch]


def test_a_killed_torch_rank_is_retried_from_its_checkpoint_each_epoch_logged_once(
    spark, mlflow_server, digits_dataset, store, tmp_path
):
    pytest.importorskip("torch", reason="torch is not installed (the classic profile has it)")
    checkpoints = store.config.uri(store.config.key("checkpoints-torch"))
    config = TrainConfig(
        training={"framework": "torch", "epochs": 5, "batch_size": 8, "checkpoints": checkpoints},
        launcher={"np": 2, "retries": 1},
        tracking={"experiment": "tests-torch-resume", "registered_model_name": "tests-torch"},
    )
    consume, killed = kill_rank_when("Epoch 3/5")
    result = train_and_track(
        spark,
        config,
        digits_dataset,
        mlflow_server.tracking_uri,
        log_dir=str(tmp_path / "logs"),
        on_log_line=consume,
    )
    assert killed.is_set() and result.attempts == 2
    client = MlflowClient(mlflow_server.tracking_uri)
    for key in EPOCH_METRICS:
        steps = [m.step for m in client.get_metric_history(result.run_id, key)]
        assert sorted(steps) == [0, 1, 2, 3, 4], key  # every epoch once, none twice
    assert len(result.history["val_accuracy"]) == 5 and len(result.epoch_times) == 5
    assert result.model_version is not None  # the retried training registered its model
    log = client.download_artifacts(
        result.run_id, "logs/attempt-2/driver.log", str(tmp_path / "attempt-2")
    )
    text = open(log).read()
    resumed_after = int(text.split("resuming after epoch ")[1].split()[0])
    assert resumed_after >= 2  # epochs 1 and 2 were checkpointed before the kill in epoch 3
    for epoch in range(1, resumed_after + 1):
        assert f"Epoch {epoch}/5" not in text  # a finished epoch is not trained again
    assert wait_for_no_ranks() == []
