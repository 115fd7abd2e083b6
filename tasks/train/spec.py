"""What every rank of a training runs: the training parameters, the dataset and the weights as
one ``TrainSpec``. Apart from the MLflow run that tracks it, so that the benchmark and the
studies, which build specs of their own, load neither boto3 nor MLflow for it."""

from __future__ import annotations

from hvdflow.tasks.config import TrainingParams
from hvdflow.tasks.train.config import TrainConfig
from hvdflow.training.frameworks import framework
from hvdflow.training.spec import DataSpec, OptimizerSpec, TrackingSpec, TrainSpec


def training_spec(training: TrainingParams, dataset, weights=None) -> TrainSpec:
    """What every rank trains on this dataset (a DatasetManifest), with these weights (a
    StagedWeights, or None): the training parameters' share of ``TrainSpec``."""
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
        framework=training.framework,
        epochs=training.epochs,
        batch_size=training.batch_size,
        global_batch=bool(training.global_batch),
        seed=training.seed,
        optimizer=OptimizerSpec(
            name=training.optimizer,
            learning_rate=training.learning_rate,
            lr_scaling=training.lr_scaling,
            warmup_epochs=training.warmup_epochs,
        ),
        weights_uri=weights.uri if weights else None,
        weights_sha256=weights.sha256 if weights else None,
        mixed_precision=training.mixed_precision,
        in_memory_max_mb=training.in_memory_max_mb,
        reader=training.reader,
        chance_margin=training.chance_margin,
        profile_batches=training.profile_batches,
        eval_every=training.eval_every,
        eval_images=training.eval_images,
    )


def run_spec(
    config: TrainConfig,
    dataset,
    weights,
    run_id: str,
    tracking_uri: str,
    checkpoint_url: str | None,
) -> TrainSpec:
    """What every rank trains in this run: the training's spec, tracked into ``run_id`` and
    checkpointed at ``checkpoint_url``, on the launcher's engine."""
    training, launcher, tracking = config.training, config.launcher, config.tracking
    return training_spec(training, dataset, weights).replace(
        tracking=TrackingSpec(run_id, tracking_uri, tracking.registered_model_name),
        checkpoint_url=checkpoint_url,
        checkpoint_keep=training.checkpoint_keep,
        engine=training_engine(config),
        fp16_compression=launcher.horovod.fp16_compression,
    )


def training_engine(config: TrainConfig) -> str:
    """What synchronises the ranks: the launcher's engine, or torch's for a PyTorch training."""
    return framework(config.training.framework).engine or config.launcher.engine
