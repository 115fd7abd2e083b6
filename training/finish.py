"""What every image trainer does around its own loop, whatever the framework: before it, the
batch, steps and learning-rate plan and the tracking run; after it, the verdict against chance,
rank 0's registered model and one ``RankResult``. The trainers differ in their loops only."""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

from hvdflow.infra.errors import disk_full_as
from hvdflow.infra.launcher import log_to_driver
from hvdflow.infra.tracking import TRACKER_WAIT_S, wait_until_reachable
from hvdflow.training.optimizers import LearningRatePlan, learning_rate_plan, rank_batch_size
from hvdflow.training.quality import rejection
from hvdflow.training.reader import steps_per_epoch
from hvdflow.training.result import RankResult
from hvdflow.training.spec import TrainSpec


class TrainingPlan(NamedTuple):
    """How this rank trains: ``batch`` images a step, ``steps`` an epoch, the learning rate."""

    batch: int
    steps: int
    rate: LearningRatePlan


def plan_training(spec: TrainSpec, rank: int, size: int, versions: str = "") -> TrainingPlan:
    """The plan of ``spec`` on ``size`` ranks; rank 0 says it on the driver, with ``versions``."""
    batch = rank_batch_size(spec.batch_size, size, spec.global_batch)
    steps = steps_per_epoch(spec.data.train_rows, size, batch)
    opt = spec.optimizer
    rate = learning_rate_plan(
        opt.name,
        opt.learning_rate,
        size,
        opt.lr_scaling,
        opt.warmup_epochs,
        steps,
        spec.global_batch,
    )
    if rank == 0:
        log_to_driver(
            f"batch: {batch * size} = {size} rank(s) x {batch}"
            + (" (global_batch: the one-rank batch, split)" if spec.global_batch else "")
            + f"; learning rate: {rate.describe()}"
            + (f"; {versions}" if versions else "")
        )
    return TrainingPlan(batch, steps, rate)


def track_to(spec: TrainSpec) -> str:
    """The MLflow run rank 0 logs to, its tracking URI set here: the driver's
    ``mlflow.set_tracking_uri()`` does not reach a rank."""
    import mlflow  # noqa: PLC0415 (lazy: only rank 0 of a tracked run logs)

    if spec.tracking.tracking_uri:
        mlflow.set_tracking_uri(spec.tracking.tracking_uri)
    return spec.tracking.run_id


def class_labels(spec: TrainSpec) -> tuple[str, ...]:
    """The class names by label index that travel inside the registered model."""
    return spec.data.labels or tuple(str(i) for i in range(spec.data.num_classes))


def register_model(
    spec: TrainSpec, log: Callable[[str | None], Any], classifier, reader: str
) -> tuple[str | None, dict | None]:
    """In the tracking run: ``log(name)`` logs and registers the model (its ``ModelInfo``); then
    ``classifier``, the logged pyfunc model, is evaluated on the validation split. Returns (the
    registered version, the evaluation); a failed evaluation leaves the model registered."""
    import mlflow  # noqa: PLC0415 (lazy: only rank 0 of a tracked run registers)

    from hvdflow.training.evaluation import evaluate_logged  # noqa: PLC0415 (lazy: MLflow)

    with mlflow.start_run(run_id=spec.tracking.run_id):
        info = log(spec.tracking.registered_model_name)
        try:
            evaluation = evaluate_logged(info, classifier, spec.data.val_url, reader)
        except Exception as e:  # a report about a registered model: never undoes it
            log_to_driver(f"mlflow.models.evaluate failed, the model stays registered: {e!r}")
            evaluation = None
    version = getattr(info, "registered_model_version", None)
    return (str(version) if version is not None else None), evaluation


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
    """Rank ``rank``'s result; rank 0 logs and registers the model (``log_model()``) where
    ``registers`` and it beats chance (``spec.chance_margin``). ``history`` and ``epoch_times``
    start with the checkpoint ``resumed`` from, if any."""
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
            # An earlier attempt registered, then died before its flow recorded it: one version.
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
    """A full disk while rank 0 logs the model (MLflow writes it to TMPDIR first) as a
    transient DiskFullError that says where and what to do."""
    return disk_full_as(
        f"the model could not be logged to MLflow run {spec.tracking.run_id}: no space left "
        f"on device in {tempfile.gettempdir()} (MLflow writes a model there before it "
        "uploads it). Free space there, or point TMPDIR at a larger disk; the next attempt "
        "resumes from the last checkpoint and logs it again"
    )


def registered_version(name: str | None, run_id: str) -> str | None:
    """The version of ``name`` that MLflow run ``run_id`` registered (the newest, if several),
    or None."""
    from mlflow import MlflowClient  # noqa: PLC0415 (lazy: it loads MLflow)

    found = MlflowClient().search_model_versions(f"run_id = '{run_id}'")
    versions = [int(v.version) for v in found if v.name == name]
    return str(max(versions)) if versions else None
