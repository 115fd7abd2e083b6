"""The rules that every orchestrator's face follows, written once in the steps: which trainings
stage weights, which need Spark, when champion moved."""

from __future__ import annotations

import pytest

from hvdflow.tasks.config import TrainingParams
from hvdflow.tasks.train.run import TrainResult, spark_for_ranks
from hvdflow.tasks.weights.stage import staging_inputs, weights_wanted

pytestmark = pytest.mark.unit


def test_only_a_keras_training_with_a_source_stages_weights():
    assert weights_wanted(TrainingParams())  # the offline source, TensorFlow
    assert not weights_wanted(TrainingParams(weights_source=""))
    torch = TrainingParams.model_construct(weights_source="keras:weights=None", framework="torch")
    assert not weights_wanted(torch)


def test_ranks_on_the_driver_start_no_spark():
    assert spark_for_ranks(-2, "spark://nowhere.invalid:7077") is None
    assert spark_for_ranks(0, None) is None


def result(version, aliases) -> TrainResult:
    return TrainResult("r", "e", "http://t", version, aliases, 1.0, 1.0, [], [])


def test_champion_moved_only_when_this_version_holds_it():
    assert result("3", ["candidate", "champion"]).champion_moved
    assert not result("3", ["candidate"]).champion_moved
    assert not result(None, ["champion"]).champion_moved


def test_weights_are_built_for_the_datasets_input_and_classes():
    class Dataset:
        image_shape, num_classes = (8, 8), 7  # grey images are stored without their channel

    assert staging_inputs(Dataset()) == ((8, 8, 1), 7)
