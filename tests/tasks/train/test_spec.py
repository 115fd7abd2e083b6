"""The rank's spec is made from the training parameters by name: no list of fields between them."""

from __future__ import annotations

from dataclasses import fields
from types import SimpleNamespace

import pytest

from hvdflow.tasks.config import TrainingParams
from hvdflow.tasks.train.spec import training_spec
from hvdflow.training.spec import DataSpec, OptimizerSpec, TrainSpec

pytestmark = pytest.mark.unit

LABELS = tuple(str(i) for i in range(10))
DATASET = SimpleNamespace(
    train_url="s3://b/train",
    val_url="s3://b/val",
    train_rows=100,
    val_rows=10,
    num_classes=10,
    image_shape=[8, 8, 1],
    class_names=LABELS,
)
TRAINING = TrainingParams(
    model="mnist_cnn",
    epochs=4,
    batch_size=16,
    global_batch=False,
    optimizer="sgd",
    learning_rate=0.05,
    lr_scaling="linear",
    warmup_epochs=0.5,
    chance_margin=0.1,
    eval_every=0.5,
    eval_images=64,
    seed=3,
    checkpoint_keep=3,
    in_memory_max_mb=5.0,
    reader="pyarrow",
    mixed_precision=True,
    profile_batches=(2, 4),
)


def test_the_spec_holds_the_parameters_the_ranks_need():
    weights = SimpleNamespace(uri="s3://b/weights.h5", sha256="ab12")
    assert training_spec(TRAINING, DATASET, weights) == TrainSpec(
        data=DataSpec("s3://b/train", "s3://b/val", 100, 10, 10, (8, 8, 1), LABELS),
        model_name="mnist_cnn",
        framework="tensorflow",
        epochs=4,
        batch_size=16,
        global_batch=False,
        seed=3,
        optimizer=OptimizerSpec("sgd", 0.05, "linear", 0.5),
        weights_uri="s3://b/weights.h5",
        weights_sha256="ab12",
        checkpoint_keep=3,
        mixed_precision=True,
        in_memory_max_mb=5.0,
        reader="pyarrow",
        chance_margin=0.1,
        eval_every=0.5,
        eval_images=64,
        profile_batches=(2, 4),
    )


def test_every_parameter_named_like_a_field_of_the_spec_arrives_in_it():
    """A parameter the ranks need is a spec field of the same name: nothing else to change."""
    spec = training_spec(TRAINING, DATASET)
    for cls, made in ((TrainSpec, spec), (OptimizerSpec, spec.optimizer)):
        for field in fields(cls):
            if field.name in TrainingParams.model_fields and field.name != "optimizer":
                assert getattr(made, field.name) == getattr(TRAINING, field.name), field.name
    assert (spec.model_name, spec.optimizer.name) == (TRAINING.model, TRAINING.optimizer)
    assert (spec.weights_uri, spec.weights_sha256) == (None, None)
