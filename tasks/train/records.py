"""What a training's MLflow run records: its parameters (checked on a resumed run), the
measures of its last attempt, and the artifacts (rank logs, Horovod's timeline, the dataset's
labels and quarantine list)."""

from __future__ import annotations

import logging
import os
import tempfile

import mlflow

from hvdflow.infra.storage.object_store import ObjectStore
from hvdflow.infra.tracking import TRACKER_WAIT_S, wait_until_reachable
from hvdflow.tasks.config import LauncherParams
from hvdflow.tasks.train.config import TrainConfig
from hvdflow.tasks.train.resume import backfill_epoch_metrics, check_same_params
from hvdflow.tasks.train.spec import training_engine
from hvdflow.training.optimizers import rank_batch_size, resolve_scaling, scaled_learning_rate
from hvdflow.training.result import RankResult

logger = logging.getLogger(__name__)


def run_params(config: TrainConfig, dataset, weights) -> dict:
    """The run's parameters: what trained, on what, with which knobs (no secret)."""
    training, launcher = config.training, config.launcher
    rule = (
        "none"
        if training.global_batch
        else resolve_scaling(training.optimizer, training.lr_scaling)
    )
    params = {
        "model": training.model,
        "framework": training.framework,
        "np": launcher.np,
        "engine": training_engine(config),
        "mixed_precision": training.mixed_precision,
        "epochs": training.epochs,
        "batch_size": training.batch_size,
        "global_batch": bool(training.global_batch),
        "rank_batch_size": rank_batch_size(
            training.batch_size, launcher.np, bool(training.global_batch)
        ),
        "base_learning_rate": training.learning_rate,
        "scaled_learning_rate": scaled_learning_rate(training.learning_rate, launcher.np, rule),
        "optimizer": training.optimizer,
        "lr_scaling": rule,
        # A global batch kept whatever np needs no warm-up, and gets none.
        "warmup_epochs": 0.0 if training.global_batch else training.warmup_epochs,
        "eval_every": training.eval_every,
        "eval_images": training.eval_images,
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


def log_or_check_params(
    params: dict, tracking_uri: str, resume_id: str | None, run_id: str
) -> None:
    """A new run logs its parameters; a resumed one must have been logged with the same."""
    if resume_id:
        check_same_params(tracking_uri, resume_id, params)
        logger.info("resuming MLflow run %s from its last checkpoint", run_id)
    else:
        mlflow.log_params(params)


def log_metrics(
    tracking_uri: str,
    run_id: str,
    result: RankResult,
    wall: float,
    attempt: int,
    epoch_times_log: dict[int, float],
) -> float:
    """Log what the last attempt measured, and the epoch metrics rank 0 could not send; return
    the run's images/s (images x epochs / wall clock, launch overhead included)."""
    # The tracking server may have gone away during training: it is waited for, not skipped.
    wait_until_reachable(tracking_uri, TRACKER_WAIT_S, logger.warning)
    images_per_s = result.images_per_epoch * result.epochs_run / wall
    mlflow.log_metrics(
        {
            "wall_clock_s": wall,  # launch overhead included
            "train_seconds": result.train_seconds,
            "images_per_s": images_per_s,
            "scaled_learning_rate": result.scaled_learning_rate,
            "training_attempts": attempt,
        }
    )
    backfill_epoch_metrics(tracking_uri, run_id, result.history)
    for epoch, seconds in sorted(epoch_times_log.items()):
        mlflow.log_metric("epoch_time_log_s", seconds, step=epoch - 1)
    for epoch, seconds in enumerate(result.epoch_times):
        mlflow.log_metric("images_per_s_epoch", result.images_per_epoch / seconds, step=epoch)
    return images_per_s


def log_artifacts(runner, launcher: LauncherParams, dataset, attempt: int = 1) -> None:
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
