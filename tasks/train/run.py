"""One training as one MLflow run: parameters, metrics and artifacts logged, the model judged,
registered and given its aliases.

Training survives what clusters do to it: rank 0 checkpoints every epoch, a transient failure
(a rank killed, a host lost, a stall) runs again from the last checkpoint in the same MLflow run,
and a tracking server that goes away during training costs no epoch (``hvdflow.training.callbacks``
buffers the metrics; ``backfill_epoch_metrics`` logs what never arrived). Aliases for registry
consumers (``candidate``, ``champion``) are settled race-free by ``hvdflow.tasks.train.registry``.
"""

from __future__ import annotations

import logging
import os
import tempfile
from dataclasses import dataclass, field

from pydantic import BaseModel, ConfigDict

import hvdflow
from hvdflow.infra.secrets import redact_url
from hvdflow.infra.storage.object_store import ObjectStore
from hvdflow.infra.tracking import check_reachable, wait_until_reachable
from hvdflow.tasks.config import LauncherParams, TrackingParams, TrainingParams
from hvdflow.tasks.train import model_card
from hvdflow.tasks.train.attempts import Attempts
from hvdflow.tasks.train.registry import assign_aliases
from hvdflow.tasks.train.resume import (
    backfill_epoch_metrics,
    check_same_params,
    checkpoint_url_for,
    run_to_resume,
)
from hvdflow.tasks.train.tags import ATTEMPTS_TAG, FLOW_RUN_TAG, REJECTED_TAG
from hvdflow.training.optimizers import resolve_scaling, scaled_learning_rate
from hvdflow.training.spec import DataSpec, OptimizerSpec, TrackingSpec, TrainSpec

logger = logging.getLogger(__name__)

# How long the driver waits for a tracking server that is down before logging a finished run.
TRACKER_WAIT_S = 300.0


class ModelRejected(RuntimeError):
    """The training finished, but its model is no better than chance or diverged: the run is
    marked failed in MLflow and the model is not registered. Not retried: the same settings
    would train the same way."""


class TrainConfig(BaseModel):
    """The training step's share of a flow's parameters."""

    model_config = ConfigDict(frozen=True, extra="forbid", hide_input_in_errors=True)

    training: TrainingParams = TrainingParams()
    launcher: LauncherParams = LauncherParams()
    tracking: TrackingParams = TrackingParams()


@dataclass
class TrainResult:
    run_id: str
    experiment_id: str
    tracking_uri: str
    model_version: str | None
    aliases: list[str]
    wall_clock_s: float
    images_per_s: float
    epoch_times: list[float]
    epoch_times_log: list[float]
    history: dict[str, list[float]] = field(default_factory=dict)
    attempts: int = 1


def train_and_track(
    spark,
    config: TrainConfig,
    dataset,
    tracking_uri: str,
    weights=None,
    log_dir: str | None = None,
    on_log_line=None,
    flow_run_id: str | None = None,
) -> TrainResult:
    """Train on ``dataset`` (a DatasetManifest) with ``config.launcher.np`` ranks; track it.

    A training that fails transiently (a rank killed, a host lost, a stall) runs again up to
    ``launcher.retries`` times, resuming from its last checkpoint in the same MLflow run. The run
    continued is ``tracking.resume``'s, else the failed run of this Prefect flow run (a flow run
    retried from the UI), else a new one.
    """
    import mlflow

    training, launcher, tracking = config.training, config.launcher, config.tracking
    check_reachable(tracking_uri)  # before any rank starts
    mlflow.set_tracking_uri(tracking_uri)
    experiment = mlflow.set_experiment(tracking.experiment)
    mlflow.set_system_metrics_sampling_interval(1)
    resume_id = run_to_resume(tracking_uri, experiment.experiment_id, tracking.resume, flow_run_id)
    tags = {FLOW_RUN_TAG: flow_run_id} if flow_run_id else None
    with mlflow.start_run(run_id=resume_id, log_system_metrics=True, tags=tags) as run:
        run_id = run.info.run_id
        checkpoint_url = checkpoint_url_for(training.checkpoints, run_id)
        params = {**_params(config, dataset, weights), "checkpoints": checkpoint_url or "off"}
        if resume_id:
            check_same_params(tracking_uri, resume_id, params)
            logger.info("resuming MLflow run %s from its last checkpoint", run_id)
        else:
            mlflow.log_params(params)
        before = int(run.data.tags.get(ATTEMPTS_TAG, "0")) if resume_id else 0
        attempt = Attempts(launcher, spark, log_dir, on_log_line, before)
        result = attempt.until_done(
            training_spec(training, dataset, weights).replace(
                tracking=TrackingSpec(run_id, tracking_uri, tracking.registered_model_name),
                checkpoint_url=checkpoint_url,
                checkpoint_keep=training.checkpoint_keep,
                engine=launcher.engine,
                fp16_compression=launcher.horovod.fp16_compression,
            ),
            log_artifacts=lambda runner, n: _log_artifacts(runner, launcher, dataset, n),
        )
        wall = attempt.last_wall_s
        wait_until_reachable(tracking_uri, TRACKER_WAIT_S, logger.warning)
        # The epochs this attempt trained: fewer than asked when the training stopped early.
        epochs_run = len(result["epoch_times"]) - result["resumed_from_epoch"]
        metrics = {
            "wall_clock_s": wall,  # launch overhead included
            "train_seconds": result["train_seconds"],
            # The paper's measure: images x epochs / wall-clock, over this attempt's epochs.
            "images_per_s": result["images_per_epoch"] * epochs_run / wall,
            "scaled_learning_rate": result["scaled_learning_rate"],
            "training_attempts": attempt.number,
        }
        mlflow.log_metrics(metrics)
        backfill_epoch_metrics(tracking_uri, run_id, result["history"])
        epoch_times_log = attempt.epoch_times_log()
        for epoch, seconds in sorted(epoch_times_log.items()):
            mlflow.log_metric("epoch_time_log_s", seconds, step=epoch - 1)
        for epoch, seconds in enumerate(result["epoch_times"]):
            mlflow.log_metric(
                "images_per_s_epoch", result["images_per_epoch"] / seconds, step=epoch
            )
        rejected = result.get("rejected")
        if rejected:
            if result.get("stopped"):
                mlflow.set_tag("hvdflow.stopped", result["stopped"])
            mlflow.set_tag(REJECTED_TAG, rejected)
            # Raised inside the run: MLflow ends it as FAILED.
            raise ModelRejected(f"run {run_id}: {rejected}")
        registry = mlflow.MlflowClient(tracking_uri)
        aliases = assign_aliases(
            tracking.registered_model_name, result["model_version"], client=registry
        )
        # What the MLflow pages show beside the wall clock: steady-state throughput (the first
        # epoch's warm-up left out), and on the version's page what produced it.
        steady = model_card.steady_images_per_s(result["images_per_epoch"], result["epoch_times"])
        if steady is not None:
            mlflow.log_metric(model_card.STEADY_METRIC, steady)
        model_card.describe_version(
            tracking.registered_model_name,
            result["model_version"],
            dataset_fingerprint=dataset.fingerprint,
            # What really trained: fewer ranks than np after an elastic resume.
            np=result["size"] if launcher.np > 0 else launcher.np,
            engine=getattr(launcher, "engine", model_card.DEFAULT_ENGINE),
            flow_run_url=model_card.flow_run_url(flow_run_id),
            flow_run_id=flow_run_id,
            run_id=run_id,
            steady_images_per_s=steady,
            val_accuracy=(result["history"].get("val_accuracy") or [None])[-1],
            dataset=dataset.path,
            code_version=hvdflow.__version__,
            evaluation=result.get("evaluation"),
            client=registry,
        )

    logger.info(
        "run %s: %.1f images/s, model %s version %s %s",
        run_id,
        metrics["images_per_s"],
        tracking.registered_model_name,
        result["model_version"],
        aliases,
    )
    return TrainResult(
        run_id=run_id,
        experiment_id=experiment.experiment_id,
        tracking_uri=redact_url(tracking_uri),  # the result is persisted: no login in it
        model_version=result["model_version"],
        aliases=aliases,
        wall_clock_s=wall,
        images_per_s=metrics["images_per_s"],
        epoch_times=result["epoch_times"],
        epoch_times_log=[epoch_times_log[e] for e in sorted(epoch_times_log)],
        history=result["history"],
        attempts=attempt.number,
    )


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
        epochs=training.epochs,
        batch_size=training.batch_size,
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
        chance_margin=training.chance_margin,
        profile_batches=training.profile_batches,
    )


def _params(config: TrainConfig, dataset, weights) -> dict:
    training, launcher = config.training, config.launcher
    rule = resolve_scaling(training.optimizer, training.lr_scaling)
    params = {
        "model": training.model,
        "np": launcher.np,
        "engine": launcher.engine,
        "mixed_precision": training.mixed_precision,
        "epochs": training.epochs,
        "batch_size": training.batch_size,
        "base_learning_rate": training.learning_rate,
        "scaled_learning_rate": scaled_learning_rate(training.learning_rate, launcher.np, rule),
        "optimizer": training.optimizer,
        "lr_scaling": rule,
        "warmup_epochs": training.warmup_epochs,
        "seed": training.seed,
        "profile_batches": list(training.profile_batches),
        "dataset_fingerprint": dataset.fingerprint,
        "dataset_path": dataset.path,
        "train_rows": dataset.train_rows,
        "val_rows": dataset.val_rows,
        "quarantined": dataset.quarantined,
        "weights_uri": weights.uri if weights else "none",
    }
    # Horovod's knobs, but never extra_env: it may carry secrets.
    for key, value in launcher.horovod.model_dump(exclude={"extra_env"}).items():
        params[f"horovod_{key}"] = value
    return params


def _log_artifacts(runner, launcher: LauncherParams, dataset, attempt: int = 1) -> None:
    import mlflow

    if runner.log_path and os.path.exists(runner.log_path):
        mlflow.log_artifact(runner.log_path, "logs" if attempt == 1 else f"logs/attempt-{attempt}")
    for path in (launcher.horovod.timeline_path, launcher.horovod.autotune_log):
        if path and os.path.exists(path):
            mlflow.log_artifact(path, "horovod")
    # A dataset in a bucket is downloaded for the upload, into a folder that goes with it.
    with tempfile.TemporaryDirectory(prefix="hvdflow-artifact-") as scratch:
        for name in ("labels.json", "quarantine.csv"):
            local = _local_dataset_file(dataset, name, scratch)
            if local:
                mlflow.log_artifact(local, "dataset")


def _local_dataset_file(dataset, name: str, scratch: str) -> str | None:
    if dataset.path.startswith("s3://"):
        target = os.path.join(scratch, name)
        ObjectStore().download_file(f"{dataset.path}/{name}", target)
        return target
    path = os.path.join(dataset.path, name)
    return path if os.path.exists(path) else None
