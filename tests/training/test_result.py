"""A RankResult survives what it crosses: the pickle from rank 0 and the baseline's JSON."""

from __future__ import annotations

import json

import cloudpickle
import pytest

from hvdflow.training.result import RankResult

pytestmark = pytest.mark.unit

RESULT = RankResult(
    size=2,
    history={"loss": (2.0, 1.0, 0.5), "val_accuracy": (0.4, 0.7, 0.9)},
    epoch_times=(3.0, 1.0, 1.0),  # tuples again after JSON's lists
    train_seconds=5.5,
    steps_per_epoch=10,
    images_per_epoch=640,
    resumed_from_epoch=1,
    scaled_learning_rate=0.0014,
    warmup_steps=10,
    model_version="3",
    evaluation={"metrics": {"accuracy_score": 0.9}, "artifacts": {}, "images": 100},
    profile={"batches": [5, 15], "step_ms": 12.5},
)


def test_a_result_comes_back_equal_from_cloudpickle_and_from_json():
    # Rank 0's return value is cloudpickled to the driver; the baseline's is one JSON line.
    assert cloudpickle.loads(cloudpickle.dumps(RESULT)) == RESULT
    assert RankResult.from_dict(json.loads(json.dumps(RESULT.to_dict()))) == RESULT
    bare = RankResult(2, {}, (), 0.0, 1, 64)  # what a rank that trained no epoch returns
    assert RankResult.from_dict(json.loads(json.dumps(bare.to_dict()))) == bare


def test_a_result_is_frozen_and_reads_what_the_driver_logs():
    with pytest.raises(AttributeError):
        RESULT.model_version = "4"  # type: ignore[misc]
    assert RESULT.epochs_run == 2  # the first epoch came from the checkpoint
    assert RESULT.final_val_accuracy == 0.9
    assert RankResult(1, {"loss": (1.0,)}, (1.0,), 1.0, 1, 64).final_val_accuracy is None
