"""Steps 3 and 4: train with HorovodRunner, log everything to MLflow, register the model.

Training survives what clusters do to it: rank 0 checkpoints every epoch, a transient failure
(a rank killed, a host lost, a stall) runs again from the last checkpoint in the same MLflow run,
and a tracking server that goes away during training costs no epoch (``hvdflow.training.callbacks``
buffers the metrics; ``backfill_epoch_metrics`` logs what never arrived). Aliases for registry
consumers (``candidate``, ``champion``) are settled race-free by ``hvdflow.tasks.registry``.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass, field

from pydantic import BaseModel, ConfigDict

from hvdflow.infra.secrets import redact_url
from hvdflow.infra.tracking import check_reachable, wait_until_reachable
from hvdflow.tasks.config import LauncherParams, TrackingParams, TrainingParams
from hvdflow.tasks.registry import assign_aliases
from hvdflow.training.epoch_log import epoch_times_by_number
from hvdflow.training.optimizers import resolve_scaling, scaled_learning_rate

logger = logging.getLogger(__name__)

# The MLflow run's tag naming the Prefect flow run that trained it: a retried flow run resumes it.
FLOW_RUN_TAG = "hvdflow.flow_run_id"
# The MLflow run's tag counting the trainings started for it, resumed ones included.
ATTEMPTS_TAG = "hvdflow.training_attempts"
# How long the driver waits for a tracking server that is down before logging a finished run.
TRACKER_WAIT_S = 300.0
# The MLflow run's tag saying why its model was not published (hvdflow.training.quality).
REJECTED_TAG = "hvdflow.rejected"


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
    resume_id = run_to_resume(experiment.experiment_id, tracking.resume, flow_run_id)
    tags = {FLOW_RUN_TAG: flow_run_id} if flow_run_id else None
    with mlflow.start_run(run_id=resume_id, log_system_metrics=True, tags=tags) as run:
        run_id = run.info.run_id
        checkpoint_url = checkpoint_url_for(training.checkpoints, run_id)
        params = {**_params(config, dataset, weights), "checkpoints": checkpoint_url or "off"}
        if resume_id:
            _check_same_params(resume_id, params)
            logger.info("resuming MLflow run %s from its last checkpoint", run_id)
        else:
            mlflow.log_params(params)
        before = int(run.data.tags.get(ATTEMPTS_TAG, "0")) if resume_id else 0
        attempt = _Attempts(config, spark, log_dir, on_log_line, before)
        result = attempt.until_done(
            train_classifier_kwargs={
                **training_kwargs(training, dataset, weights),
                "run_id": run_id,
                "tracking_uri": tracking_uri,
                "registered_model_name": tracking.registered_model_name,
                "checkpoint_url": checkpoint_url,
                "checkpoint_keep": training.checkpoint_keep,
                "engine": launcher.engine,
                "fp16_compression": launcher.horovod.fp16_compression,
            },
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
        backfill_epoch_metrics(run_id, result["history"])
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
        aliases = assign_aliases(tracking.registered_model_name, result["model_version"])
        # What the MLflow pages show beside the wall clock: steady-state throughput (the first
        # epoch's warm-up left out), and on the version's page what produced it.
        from hvdflow.tasks import model_card

        steady = model_card.steady_images_per_s(result["images_per_epoch"], result["epoch_times"])
        if steady is not None:
            mlflow.log_metric(model_card.STEADY_METRIC, steady)
        model_card.describe_version(
            tracking.registered_model_name,
            result["model_version"],
            dataset_fingerprint=dataset.fingerprint,
            np=launcher.np,
            engine=getattr(launcher, "engine", model_card.DEFAULT_ENGINE),
            flow_run_url=model_card.flow_run_url(flow_run_id),
            flow_run_id=flow_run_id,
            run_id=run_id,
            steady_images_per_s=steady,
            val_accuracy=(result["history"].get("val_accuracy") or [None])[-1],
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


class _Attempts:
    """Runs the training function on HorovodRunner until it succeeds or may not run again."""

    def __init__(self, config: TrainConfig, spark, log_dir, on_log_line, before: int = 0):
        self.config = config
        self.spark = spark
        self.log_dir = log_dir
        self.on_log_line = on_log_line
        self.before = before  # attempts made for this MLflow run before (a resumed run)
        self.count = 0  # attempts made by this call
        self.last_wall_s = 0.0
        self._lines: list[list] = []  # each attempt's rank output, for the epoch-log times

    @property
    def number(self) -> int:
        """The current attempt's number in the MLflow run, from 1."""
        return self.before + self.count

    def until_done(self, train_classifier_kwargs: dict, log_artifacts) -> dict:
        import mlflow

        from hvdflow.infra import HorovodRunner
        from hvdflow.training.trainer import train_classifier

        launcher = self.config.launcher
        while True:
            self.count += 1
            mlflow.set_tag(ATTEMPTS_TAG, str(self.number))
            lines: list = []
            self._lines.append(lines)
            runner = HorovodRunner(
                np=launcher.np,
                spark=self.spark,
                horovod=launcher.horovod,
                start_timeout_s=launcher.start_timeout_s,
                heartbeat_timeout_s=launcher.heartbeat_timeout_s,
                stall_timeout_s=launcher.stall_timeout_s,
                engine=launcher.engine,
                # Each attempt's log of its own: a retry must not append to the one that failed.
                log_dir=os.path.join(self.log_dir, f"attempt-{self.number}")
                if self.log_dir
                else None,
                on_log_line=_tee(lines.append, self.on_log_line),
            )
            started = time.perf_counter()
            try:
                return runner.run(train_classifier, **train_classifier_kwargs)
            except Exception as e:
                if not may_retry(e, self.count, launcher.retries):
                    raise
                logger.warning(
                    "training attempt %d of %d failed (%s); running it again from the last "
                    "checkpoint (launcher.retries=%d)",
                    self.count,
                    launcher.retries + 1,
                    str(e).splitlines()[0],
                    launcher.retries,
                )
            finally:
                self.last_wall_s = time.perf_counter() - started
                log_artifacts(runner, self.number)

    def epoch_times_log(self) -> dict[int, float]:
        """The paper's epoch times by epoch number, from every attempt; a later one wins."""
        times: dict[int, float] = {}
        for lines in self._lines:
            times.update(epoch_times_by_number(lines))
        return times


def may_retry(error: BaseException, attempt: int, retries: int) -> bool:
    """Whether a training that failed with ``error`` in attempt ``attempt`` (from 1) runs again.

    Only transient failures are retried: a rank killed by a signal, a host lost, a stall, or the
    Spark job itself failing (an executor lost). A Python error in the training function would
    only fail the same way again.
    """
    from hvdflow.infra.launcher import RankFailed

    if attempt > retries:
        return False
    if isinstance(error, RankFailed):
        return error.transient
    return isinstance(error, (RuntimeError, TimeoutError)) and "Spark job" in str(error)


def checkpoint_url_for(checkpoints: str, run_id: str) -> str | None:
    """Where the checkpoints of MLflow run ``run_id`` go (``TrainingParams.checkpoints``)."""
    if checkpoints == "off":
        return None
    if not checkpoints:
        from hvdflow.infra.storage.object_store import ObjectStoreConfig

        store = ObjectStoreConfig.from_env()
        return store.uri(store.key("checkpoints", run_id))
    return f"{checkpoints.rstrip('/')}/{run_id}"


def run_to_resume(experiment_id: str, resume: str, flow_run_id: str | None) -> str | None:
    """The MLflow run to continue: ``resume`` ('last' or a run id), else this flow run's failed
    one (a Prefect flow run retried), else None (a new run)."""
    from mlflow import MlflowClient

    client = MlflowClient()
    if resume and resume != "last":
        run = client.get_run(resume)  # a wrong id fails here, naming it
        if run.info.experiment_id != experiment_id:
            raise ValueError(
                f"tracking.resume={resume!r} is a run of another experiment "
                f"({run.info.experiment_id}): set tracking.experiment to its experiment"
            )
        return resume
    where = "attributes.status != 'FINISHED'"
    if resume == "last":
        # Failed ones only: a RUNNING run may be another driver's, training right now. One whose
        # driver was killed stays RUNNING too: a newer one is named, for the user to resume.
        def newest(status: str):
            runs = client.search_runs(
                [experiment_id],
                f"attributes.status = '{status}'",
                order_by=["attributes.start_time DESC"],
                max_results=1,
            )
            return runs[0] if runs else None

        failed, running = newest("FAILED"), newest("RUNNING")
        if failed is None:
            also = (
                f"; run {running.info.run_id} is RUNNING: if its driver is gone (killed, its "
                f"machine lost), continue it with --resume {running.info.run_id}"
                if running
                else ""
            )
            raise ValueError(
                f"tracking.resume='last': experiment {experiment_id} has no failed run to "
                f"continue{also}; else run without --resume"
            )
        if running is not None and running.info.start_time > failed.info.start_time:
            logger.warning(
                "tracking.resume='last' continues failed run %s; newer run %s is RUNNING and "
                "is left alone (another driver may be training it; if its driver is gone, "
                "continue it with --resume %s)",
                failed.info.run_id,
                running.info.run_id,
                running.info.run_id,
            )
        return failed.info.run_id
    if flow_run_id:
        runs = client.search_runs(
            [experiment_id],
            f"{where} and tags.`{FLOW_RUN_TAG}` = '{flow_run_id}'",
            order_by=["attributes.start_time DESC"],
            max_results=1,
        )
        return runs[0].info.run_id if runs else None
    return None


def _check_same_params(run_id: str, params: dict) -> None:
    """A resumed run trains what it trained before: differing parameters are an error."""
    from mlflow import MlflowClient

    logged = MlflowClient().get_run(run_id).data.params
    differ = {
        k: (logged[k], str(v)) for k, v in params.items() if k in logged and logged[k] != str(v)
    }
    if differ:
        shown = ", ".join(f"{k} was {old!r}, now {new!r}" for k, (old, new) in differ.items())
        raise ValueError(
            f"run {run_id} cannot be resumed with other parameters ({shown}): resume with the "
            "same ones, or start a new run"
        )


def backfill_epoch_metrics(run_id: str, history: dict[str, list[float]]) -> int:
    """Log the epochs of ``history`` that the run lacks (rank 0 could not send them during a
    tracking-server outage); the number of metric points logged. Idempotent."""
    from mlflow import MlflowClient
    from mlflow.entities import Metric

    client = MlflowClient()
    now = int(time.time() * 1000)
    missing = []
    for key, values in history.items():
        logged = {m.step for m in client.get_metric_history(run_id, key)}
        missing += [
            Metric(key, v, now, step) for step, v in enumerate(values) if step not in logged
        ]
    for i in range(0, len(missing), 1000):  # MLflow's limit per batch
        client.log_batch(run_id, metrics=missing[i : i + 1000])
    if missing:
        logger.warning(
            "logged %d epoch metric point(s) the training could not send to MLflow itself",
            len(missing),
        )
    return len(missing)


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
        "lr_scaling": training.lr_scaling,
        "warmup_epochs": training.warmup_epochs,
        "chance_margin": training.chance_margin,
        "seed": training.seed,
        "weights_uri": weights.uri if weights else None,
        "weights_sha256": weights.sha256 if weights else None,
        "mixed_precision": training.mixed_precision,
        "in_memory_max_mb": training.in_memory_max_mb,
    }


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
    for name in ("labels.json", "quarantine.csv"):
        local = _local_dataset_file(dataset, name)
        if local:
            mlflow.log_artifact(local, "dataset")


def _local_dataset_file(dataset, name: str) -> str | None:
    if dataset.path.startswith("s3://"):
        import tempfile

        from hvdflow.infra.storage.object_store import ObjectStore

        target = os.path.join(tempfile.mkdtemp(prefix="hvdflow-artifact-"), name)
        ObjectStore().download_file(f"{dataset.path}/{name}", target)
        return target
    path = os.path.join(dataset.path, name)
    return path if os.path.exists(path) else None
