"""A TrainSpec survives what it crosses: the pickle to every rank and the baseline's JSON."""

from __future__ import annotations

import json
import pickle

import pytest

from hvdflow.training.spec import DataSpec, OptimizerSpec, TrackingSpec, TrainSpec

pytestmark = pytest.mark.unit

SPEC = TrainSpec(
    data=DataSpec("file:///t", "file:///v", 10, 2, 10, (8, 8, 1)),
    model_name="digits_mlp",
    optimizer=OptimizerSpec("sgd", 0.01, "linear", 1.0),
    tracking=TrackingSpec("run-1", "http://127.0.0.1:5000", "m"),
    checkpoint_url="s3://b/checkpoints/run-1",
    profile_dir="/tmp/profile",
    profile_batches=(10, 20),  # a tuple again after JSON's list
)


def test_a_spec_comes_back_equal_from_pickle_and_from_json():
    assert pickle.loads(pickle.dumps(SPEC)) == SPEC
    assert TrainSpec.from_dict(json.loads(json.dumps(SPEC.to_dict()))) == SPEC
    bare = TrainSpec(data=SPEC.data, model_name="m")  # no tracking, default optimizer
    assert TrainSpec.from_dict(json.loads(json.dumps(bare.to_dict()))) == bare


def test_a_spec_is_frozen_and_replace_changes_one_field():
    with pytest.raises(AttributeError):
        SPEC.epochs = 3  # type: ignore[misc]
    changed = SPEC.replace(threads=1, engine="tf_collective")
    assert (changed.threads, changed.engine, changed.data) == (1, "tf_collective", SPEC.data)
    assert SPEC.threads is None
