"""The faces keep their originals' public attributes: code written against pyspark's
TorchDistributor or spark-tensorflow-distributor's MirroredStrategyRunner that reads an
attribute of the runner reads the same one here (the originals are installed beside ours)."""

from __future__ import annotations

import pytest

from hvdflow import LaunchOptions, MirroredStrategyRunner, TorchDistributor

pytestmark = pytest.mark.integration


def public(obj) -> set[str]:
    return {name for name in dir(obj) if not name.startswith("_")}


# pyspark's own test_validate_correct_inputs (python/pyspark/ml/torch/tests/test_distributor.py).
@pytest.mark.parametrize(
    ("num_processes", "local_mode"), [(1, True), (100, True), (1, False), (100, False)]
)
def test_torch_distributor_records_its_inputs_as_pysparks_does(spark, num_processes, local_mode):
    from pyspark.ml.torch.distributor import TorchDistributor as Original

    original = Original(num_processes, local_mode, False)
    ours = TorchDistributor(num_processes, local_mode, False, options=LaunchOptions(spark=spark))
    assert (
        ours.input_params
        == original.input_params
        == {
            "num_processes": num_processes,
            "local_mode": local_mode,
            "use_gpu": False,
            "num_tasks": num_processes,
        }
    )
    # Every public attribute of the original, methods included, is one of ours.
    assert public(original) - public(ours) == set()


def test_mirrored_strategy_runner_has_every_public_attribute_of_the_original(spark):
    from spark_tensorflow_distributor import MirroredStrategyRunner as Original

    original = Original(num_slots=2, use_gpu=False)
    ours = MirroredStrategyRunner(num_slots=2, use_gpu=False, options=LaunchOptions(spark=spark))
    assert public(original) == {"sc", "get_num_tasks", "run"}
    assert public(original) - public(ours) == set()
    assert ours.sc is original.sc and ours.get_num_tasks() == original.get_num_tasks() == 2
