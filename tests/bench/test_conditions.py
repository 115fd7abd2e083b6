"""The benchmark's repetitions: MLPerf Training's rule, a seed per repetition."""

import pytest

from hvdflow.bench.conditions import seeded_for
from hvdflow.training.spec import DataSpec, TrainSpec

pytestmark = pytest.mark.unit
SPEC = TrainSpec(DataSpec("train", "val", 100, 10, 10, (28, 28)), "mnist_cnn", seed=7)


def test_each_repetition_trains_with_the_seed_plus_the_repetition_in_every_condition():
    seeds = [seeded_for("classifier", {"spec": SPEC}, r)["spec"].seed for r in range(5)]
    assert seeds == [7, 8, 9, 10, 11]
    # As the baseline process reads them back (a dict), and unchanged otherwise.
    again = seeded_for("classifier", {"spec": SPEC.to_dict()}, 2)["spec"]
    assert again == SPEC.replace(seed=9)
    assert seeded_for("gcn", {"seed": 3, "epochs": 5}, 4) == {"seed": 7, "epochs": 5}
