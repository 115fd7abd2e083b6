"""What every rank of a training runs, as one ``TrainSpec``: apart from the MLflow run, so the
benchmark and the studies load neither boto3 nor MLflow for it."""

from __future__ import annotations

import dataclasses

from hvdflow.tasks.config import TrainingParams
from hvdflow.tasks.train.config import TrainConfig
from hvdflow.training.frameworks import framework
from hvdflow.training.spec import DataSpec, OptimizerSpec, TrackingSpec, TrainSpec


def training_spec(training: TrainingParams, dataset, weights=None) -> TrainSpec:
    """The training parameters' share of ``TrainSpec`` on ``dataset`` (a DatasetManifest) with
    ``weights`` (a StagedWeights, or None). A spec field (or ``optimizer`` field) takes the
    parameter of the same name: nothing here lists them, but the model's and optimizer's names."""
    values = training.model_dump()
    return TrainSpec(
        data=DataSpec(
            train_url=dataset.train_url,
            val_url=dataset.val_url,
            train_rows=dataset.train_rows,
            val_rows=dataset.val_rows,
            num_classes=dataset.num_classes,
            input_shape=tuple(dataset.image_shape),
            labels=dataset.class_names,
        ),
        model_name=training.model,
        optimizer=OptimizerSpec(name=training.optimizer, **_same_names(OptimizerSpec, values)),
        weights_uri=weights.uri if weights else None,
        weights_sha256=weights.sha256 if weights else None,
        **_same_names(TrainSpec, values, but=("optimizer",)),
    )


def _same_names(spec_class, values: dict, but: tuple[str, ...] = ()) -> dict:
    """``values`` of ``spec_class``'s fields, by name, but ``but``."""
    return {
        f.name: values[f.name]
        for f in dataclasses.fields(spec_class)
        if f.name in values and f.name not in but
    }


def run_spec(
    config: TrainConfig,
    dataset,
    weights,
    run_id: str,
    tracking_uri: str,
    checkpoint_url: str | None,
) -> TrainSpec:
    """The training's spec, tracked into ``run_id``, checkpointed at ``checkpoint_url``."""
    training, launcher, tracking = config.training, config.launcher, config.tracking
    return training_spec(training, dataset, weights).replace(
        tracking=TrackingSpec(run_id, tracking_uri, tracking.registered_model_name),
        checkpoint_url=checkpoint_url,
        engine=training_engine(config),
        fp16_compression=launcher.horovod.fp16_compression,
    )


def training_engine(config: TrainConfig) -> str:
    """What synchronises the ranks: the launcher's engine, or torch's for a PyTorch training."""
    return framework(config.training.framework).engine or config.launcher.engine
