"""How every image trainer ends, whatever the framework: judge the model against chance, log
and register it from rank 0 (the framework's own ``log_model``), and say what the rank saw as
one ``RankResult``. The Keras and the PyTorch trainers differ before this, not here."""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from hvdflow.infra.errors import disk_full_as
from hvdflow.infra.launcher.rank_events import log_to_driver
from hvdflow.infra.tracking import TRACKER_WAIT_S, wait_until_reachable
from hvdflow.training.quality import rejection
from hvdflow.training.result import RankResult
from hvdflow.training.spec import TrainSpec


def finish_training(
    spec: TrainSpec,
    *,
    rank: int,
    size: int,
    plan,
    history: Mapping[str, Sequence[float]],
    epoch_times: Sequence[float],
    train_seconds: float,
    steps: int,
    batch: int,
    resumed,
    stopped: str | None,
    registers: bool,
    log_model: Callable[[], tuple[str | None, dict | None]],
    profile: dict[str, Any] | None = None,
) -> RankResult:
    """Rank ``rank``'s result; rank 0 logs and registers the model (``log_model()``: its
    version and evaluation) where ``registers`` and the model is no better than chance is not
    the case (``spec.chance_margin``). ``history`` and ``epoch_times`` cover the checkpoint
    ``resumed`` from, if any, first; ``plan`` is the learning-rate plan."""
    rejected = None
    if spec.chance_margin is not None:
        rejected = rejection(history, spec.data.num_classes, spec.chance_margin, plan.describe())
    version, evaluation = None, None
    if rank == 0 and rejected:
        log_to_driver(f"not registering the model: {rejected}")
    if rank == 0 and registers and not rejected:
        import mlflow  # noqa: PLC0415 (lazy: only rank 0 of a tracked run registers)

        wait_until_reachable(mlflow.get_tracking_uri(), TRACKER_WAIT_S, log_to_driver)
        version = registered_version(spec.tracking.registered_model_name, spec.tracking.run_id)
        if version is not None:
            # An earlier attempt of this run registered, then died before its flow recorded
            # it: the same run, the same final weights (its checkpoint), one version.
            log_to_driver(
                f"MLflow run {spec.tracking.run_id} already registered version {version} of "
                f"{spec.tracking.registered_model_name} (an earlier attempt): not again"
            )
        else:
            with _model_disk_full_said(spec):
                version, evaluation = log_model()
    return RankResult(
        size=size,
        history={key: tuple(values) for key, values in history.items()},
        epoch_times=tuple(epoch_times),
        train_seconds=train_seconds,
        steps_per_epoch=steps,
        images_per_epoch=steps * batch * size,
        resumed_from_epoch=resumed.epoch if resumed else 0,
        scaled_learning_rate=plan.target,
        warmup_steps=plan.warmup_steps,
        stopped=stopped,
        rejected=rejected,
        model_version=version,
        evaluation=evaluation,
        profile=profile,
    )


def _model_disk_full_said(spec: TrainSpec):
    """A full disk while rank 0 logs the model (MLflow writes it into a temporary folder before
    uploading it) as a DiskFullError that says where and what to do. Transient: the next attempt
    resumes from the last checkpoint, which holds the trained weights, and registers once."""
    return disk_full_as(
        f"the model could not be logged to MLflow run {spec.tracking.run_id}: no space left "
        f"on device in {tempfile.gettempdir()} (MLflow writes a model there before it "
        "uploads it). Free space there, or point TMPDIR at a larger disk; the next attempt "
        "resumes from the last checkpoint and logs it again"
    )


def registered_version(name: str | None, run_id: str) -> str | None:
    """The version of registered model ``name`` that MLflow run ``run_id`` registered; None
    when it registered none (the newest, if several: registered by an older hvdflow)."""
    from mlflow import MlflowClient  # noqa: PLC0415 (lazy: it loads MLflow)

    found = MlflowClient().search_model_versions(f"run_id = '{run_id}'")
    versions = [int(v.version) for v in found if v.name == name]
    return str(max(versions)) if versions else None
