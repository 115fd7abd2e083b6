"""Steps 3 and 4: train with HorovodRunner, log everything to MLflow, register the model.

Aliases for registry consumers: every new version gets ``candidate``; ``champion`` moves to it
only when its final ``val_accuracy`` is strictly higher than the current champion's (a first
version becomes champion). Consumers load ``models:/<name>@champion``.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass, field

from pydantic import BaseModel, ConfigDict

from infra.secrets import redact_url
from infra.tracking import check_reachable
from tasks.config import LauncherParams, TrackingParams, TrainingParams
from training.epoch_log import epoch_times_from_log
from training.optimizers import scaled_learning_rate

logger = logging.getLogger(__name__)

CANDIDATE, CHAMPION = "candidate", "champion"
CHAMPION_METRIC = "val_accuracy"


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


def train_and_track(
    spark,
    config: TrainConfig,
    dataset,
    tracking_uri: str,
    weights=None,
    log_dir: str | None = None,
    on_log_line=None,
) -> TrainResult:
    """Train on ``dataset`` (a DatasetManifest) with ``config.launcher.np`` ranks; track it."""
    import mlflow

    from infra import HorovodRunner
    from training.trainer import train_classifier

    training, launcher, tracking = config.training, config.launcher, config.tracking
    check_reachable(tracking_uri)  # before any rank starts
    mlflow.set_tracking_uri(tracking_uri)
    experiment = mlflow.set_experiment(tracking.experiment)
    mlflow.set_system_metrics_sampling_interval(1)
    lines = []
    with mlflow.start_run(log_system_metrics=True) as run:
        run_id = run.info.run_id
        mlflow.log_params(_params(config, dataset, weights))
        runner = HorovodRunner(
            np=launcher.np,
            spark=spark,
            horovod=launcher.horovod,
            start_timeout_s=launcher.start_timeout_s,
            log_dir=log_dir,
            on_log_line=_tee(lines.append, on_log_line),
        )
        started = time.perf_counter()
        try:
            result = runner.run(
                train_classifier,
                **training_kwargs(training, dataset, weights),
                run_id=run_id,
                tracking_uri=tracking_uri,
                registered_model_name=tracking.registered_model_name,
            )
        finally:
            _log_artifacts(runner, launcher, dataset)
        wall = time.perf_counter() - started

        epoch_times_log = epoch_times_from_log(lines)
        images = result["images_per_epoch"] * training.epochs
        metrics = {
            "wall_clock_s": wall,  # launch overhead included
            "train_seconds": result["train_seconds"],
            "images_per_s": images / wall,  # the paper's measure: images x epochs / wall-clock
            "scaled_learning_rate": result["scaled_learning_rate"],
        }
        mlflow.log_metrics(metrics)
        for epoch, seconds in enumerate(epoch_times_log):
            mlflow.log_metric("epoch_time_log_s", seconds, step=epoch)
        for epoch, seconds in enumerate(result["epoch_times"]):
            mlflow.log_metric(
                "images_per_s_epoch", result["images_per_epoch"] / seconds, step=epoch
            )
        aliases = _assign_aliases(tracking.registered_model_name, result["model_version"])

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
        epoch_times_log=epoch_times_log,
        history=result["history"],
    )


def _tee(*consumers):
    consumers = [c for c in consumers if c is not None]

    def consume(line):
        for consumer in consumers:
            consumer(line)

    return consume


def training_kwargs(training: TrainingParams, dataset, weights=None) -> dict:
    """The keyword arguments of ``train_classifier`` for this dataset: plain values only."""
    return {
        "train_url": dataset.train_url,
        "val_url": dataset.val_url,
        "train_rows": dataset.train_rows,
        "val_rows": dataset.val_rows,
        "num_classes": dataset.num_classes,
        "input_shape": tuple(dataset.image_shape),
        "model_name": training.model,
        "epochs": training.epochs,
        "batch_size": training.batch_size,
        "learning_rate": training.learning_rate,
        "optimizer": training.optimizer,
        "seed": training.seed,
        "weights_uri": weights.uri if weights else None,
        "weights_sha256": weights.sha256 if weights else None,
    }


def _params(config: TrainConfig, dataset, weights) -> dict:
    training, launcher = config.training, config.launcher
    params = {
        "model": training.model,
        "np": launcher.np,
        "epochs": training.epochs,
        "batch_size": training.batch_size,
        "base_learning_rate": training.learning_rate,
        "scaled_learning_rate": scaled_learning_rate(training.learning_rate, launcher.np),
        "optimizer": training.optimizer,
        "seed": training.seed,
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


def _log_artifacts(runner, launcher: LauncherParams, dataset) -> None:
    import mlflow

    if runner.log_path and os.path.exists(runner.log_path):
        mlflow.log_artifact(runner.log_path, "logs")
    for path in (launcher.horovod.timeline_path, launcher.horovod.autotune_log):
        if path and os.path.exists(path):
            mlflow.log_artifact(path, "horovod")
    for name in ("labels.json", "quarantine.csv"):
        local = _local_dataset_file(dataset, name)
        if local:
            mlflow.log_artifact(local, "dataset")


def _local_dataset_file(dataset, name: str) -> str | None:
    if dataset.path.startswith("s3://"):
        import tempfile

        from infra.storage.object_store import ObjectStore

        target = os.path.join(tempfile.mkdtemp(prefix="hvdflow-artifact-"), name)
        ObjectStore().download_file(f"{dataset.path}/{name}", target)
        return target
    path = os.path.join(dataset.path, name)
    return path if os.path.exists(path) else None


def _assign_aliases(name: str, version: str | None) -> list[str]:
    """``candidate`` on the new version; ``champion`` too if it beats the current champion."""
    if version is None:
        return []
    from mlflow import MlflowClient
    from mlflow.exceptions import MlflowException

    client = MlflowClient()
    client.set_registered_model_alias(name, CANDIDATE, version)
    aliases = [CANDIDATE]
    new_score = _score(client, client.get_model_version(name, version).run_id)
    try:
        champion = client.get_model_version_by_alias(name, CHAMPION)
    except MlflowException:
        champion = None
    if champion is None or new_score > _score(client, champion.run_id):
        client.set_registered_model_alias(name, CHAMPION, version)
        aliases.append(CHAMPION)
    return aliases


def _score(client, run_id: str) -> float:
    return client.get_run(run_id).data.metrics.get(CHAMPION_METRIC, float("-inf"))
