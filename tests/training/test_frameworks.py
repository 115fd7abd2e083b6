"""The frameworks table: each row names things that exist, and the parameters follow it."""

from __future__ import annotations

import pytest

from hvdflow.tasks.config import TrainingParams
from hvdflow.training.frameworks import DEFAULT, FRAMEWORKS, framework

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("name", sorted(FRAMEWORKS))
def test_each_row_names_a_trainer_models_and_fields_that_exist(name):
    row = framework(name)
    assert callable(row.training_function())
    models = row.model_names()
    assert models is None or (models and all(isinstance(m, str) for m in models))
    for field in row.refuses:
        assert field in TrainingParams.model_fields, field


def test_the_parameters_accept_exactly_the_tables_frameworks():
    declared = TrainingParams.model_fields["framework"].annotation.__args__
    assert sorted(declared) == sorted(FRAMEWORKS)
    assert TrainingParams().framework == DEFAULT


def test_an_unknown_framework_is_named_with_the_known_ones():
    with pytest.raises(ValueError, match="training.framework 'jax' is unknown: expected one of"):
        framework("jax")
