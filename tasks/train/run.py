"""One training as one MLflow run: parameters, metrics and artifacts logged, the model judged,
registered and given its aliases.

Rank 0 checkpoints every epoch; a transient failure runs again from the last checkpoint in the
same MLflow run (attempts.py); a tracking-server outage costs no epoch (the ranks buffer the
metrics, ``backfill_epoch_metrics`` logs what never arrived); aliases are settled race-free
(registry.py).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from hvdflow.infra.secrets import redact_url
from hvdflow.infra.tracking import CHAMPION, check_reachable
from hvdflow.infra.version import package_version
from hvdflow.tasks.config import TrackingParams
from hvdflow.tasks.train import lease, model_card, once, records
from hvdflow.tasks.train.attempts import Attempts
from hvdflow.tasks.train.config import TrainConfig
from hvdflow.tasks.train.origin import RunOrigin
from hvdflow.tasks.train.registry import assign_aliases
from hvdflow.tasks.train.resume import checkpoint_url_for, run_to_resume
from hvdflow.tasks.train.spec import run_spec, training_engine
from hvdflow.tasks.train.tags import ATTEMPTS_TAG, FLOW_RUN_TAG, ORCHESTRATOR_TAG, REJECTED_TAG
from hvdflow.training.result import RankResult

logger = logging.getLogger(__name__)


class ModelRejected(RuntimeError):
    """The model is no better than chance or diverged: the run is marked failed and the model
    not registered. Not retried: the same settings would train the same way."""


@dataclass
class TrainResult:
    """A tracked training, as the flow sees it (orchestrators persist it: no secret in it)."""

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

    @property
    def champion_moved(self) -> bool:
        """This training's version became ``champion``: registry consumers follow it now."""
        return bool(self.model_version) and CHAMPION in self.aliases


def spark_for_ranks(np: int, spark_master: str | None):
    """The Spark session the ranks' barrier tasks run on; None for ranks on the driver (np < 0):
    a run whose dataset was cached then starts no JVM."""
    if np <= 0:
        return None
    from hvdflow.infra.spark import get_spark  # noqa: PLC0415 (lazy: it loads Spark)

    return get_spark(spark_master)


def train_and_track(
    spark,
    config: TrainConfig,
    dataset,
    tracking_uri: str,
    weights=None,
    log_dir: str | None = None,
    on_log_line=None,
    origin: RunOrigin | None = None,
) -> TrainResult:
    """Train on ``dataset`` (a DatasetManifest) with ``config.launcher.np`` ranks; track it.

    A transient failure runs again up to ``launcher.retries`` times from the last checkpoint.
    The run continued is ``tracking.resume``'s, else the failed run of the same ``origin`` (the
    orchestrator's run that trains: tagged on the MLflow run and version, linked from its card),
    else a new one.
    """
    import mlflow
    from mlflow import MlflowClient

    config = config.model_copy(update={"launcher": config.launcher.for_session(spark)})
    training, launcher, tracking = config.training, config.launcher, config.tracking
    flow_run_id = origin.run_id if origin else None
    experiment, resume_id = _experiment_and_run_to_resume(tracking, tracking_uri, flow_run_id)
    if origin and not tracking.resume:
        # A first execution of this step that outlived its worker may still train the run.
        held = resume_id and lease.wait_while_held(
            MlflowClient(tracking_uri), resume_id, f"{origin.kind} {origin.run_id}"
        )
        if held:
            experiment, resume_id = _experiment_and_run_to_resume(
                tracking, tracking_uri, flow_run_id
            )
        done = _trained_before(tracking_uri, experiment.experiment_id, origin, tracking)
        if done is not None:
            return done
    tags = {FLOW_RUN_TAG: origin.run_id, ORCHESTRATOR_TAG: origin.orchestrator} if origin else None
    with (
        mlflow.start_run(run_id=resume_id, log_system_metrics=True, tags=tags) as run,
        lease.driver_lease(MlflowClient(tracking_uri), run.info.run_id),
    ):
        run_id = run.info.run_id
        checkpoint_url = checkpoint_url_for(training.checkpoints, run_id)
        params = {
            **records.run_params(config, dataset, weights),
            "checkpoints": checkpoint_url or "off",
        }
        records.log_or_check_params(params, tracking_uri, resume_id, run_id)
        before = int(run.data.tags.get(ATTEMPTS_TAG, "0")) if resume_id else 0
        attempts = Attempts(launcher, spark, log_dir, on_log_line, before)
        result = attempts.until_done(
            run_spec(config, dataset, weights, run_id, tracking_uri, checkpoint_url),
            log_artifacts=lambda runner, n: records.log_artifacts(runner, launcher, dataset, n),
        )
        wall, epoch_times_log = attempts.last_wall_s, attempts.epoch_times_log()
        images_per_s = records.log_metrics(
            tracking_uri, run_id, result, wall, attempts.number, epoch_times_log
        )
        if result.rejected:
            # Raised inside the run: MLflow ends it as FAILED.
            raise _rejection(run_id, result)
        aliases = _publish(config, dataset, result, tracking_uri, run_id, origin)

    logger.info(
        "run %s: %.1f images/s, model %s version %s %s",
        run_id,
        images_per_s,
        tracking.registered_model_name,
        result.model_version,
        aliases,
    )
    return TrainResult(
        run_id=run_id,
        experiment_id=experiment.experiment_id,
        tracking_uri=redact_url(tracking_uri),  # the result is persisted: no login in it
        model_version=result.model_version,
        aliases=aliases,
        wall_clock_s=wall,
        images_per_s=images_per_s,
        epoch_times=list(result.epoch_times),
        epoch_times_log=[epoch_times_log[e] for e in sorted(epoch_times_log)],
        history={key: list(values) for key, values in result.history.items()},
        attempts=attempts.number,
    )


def _experiment_and_run_to_resume(
    tracking: TrackingParams, tracking_uri: str, flow_run_id: str | None
):
    """MLflow pointed at a server that answers, before any rank starts; the experiment, and
    the id of the run this training continues (None: a new run)."""
    import mlflow

    check_reachable(tracking_uri)
    mlflow.set_tracking_uri(tracking_uri)
    experiment = mlflow.set_experiment(tracking.experiment)
    mlflow.set_system_metrics_sampling_interval(1)
    resume_id = run_to_resume(tracking_uri, experiment.experiment_id, tracking.resume, flow_run_id)
    return experiment, resume_id


def _trained_before(
    tracking_uri: str, experiment_id: str, origin: RunOrigin, tracking: TrackingParams
) -> TrainResult | None:
    """What an earlier, finished execution of this step recorded for the same origin (once.py)."""
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri)
    run = once.finished_run(client, experiment_id, origin.run_id)
    if run is None:
        return None
    fields = once.recorded_result(client, run, tracking.registered_model_name)
    version = fields["model_version"]
    logger.warning(
        "%s %s has trained already: MLflow run %s finished%s. Not training again (one "
        "training and one registered version per %s; start a new one to train anew)",
        origin.kind,
        origin.run_id,
        fields["run_id"],
        f" and registered version {version}" if version else "",
        origin.kind,
    )
    return TrainResult(tracking_uri=redact_url(tracking_uri), **fields)


def _rejection(run_id: str, result: RankResult) -> ModelRejected:
    """Tag why ``result``'s model is not published (and why it stopped early); the error."""
    import mlflow

    if result.stopped:
        mlflow.set_tag("hvdflow.stopped", result.stopped)
    mlflow.set_tag(REJECTED_TAG, result.rejected)
    return ModelRejected(f"run {run_id}: {result.rejected}")


def _publish(
    config: TrainConfig,
    dataset,
    result: RankResult,
    tracking_uri: str,
    run_id: str,
    origin: RunOrigin | None,
) -> list[str]:
    """Settle the registered version's aliases and write its card; the aliases it holds now."""
    import mlflow

    launcher, tracking = config.launcher, config.tracking
    registry = mlflow.MlflowClient(tracking_uri)
    aliases = assign_aliases(tracking.registered_model_name, result.model_version, client=registry)
    steady = model_card.steady_images_per_s(result.images_per_epoch, result.epoch_times)
    if steady is not None:
        mlflow.log_metric(model_card.STEADY_METRIC, steady)
    model_card.describe_version(
        tracking.registered_model_name,
        result.model_version,
        dataset_fingerprint=dataset.fingerprint,
        # What really trained: fewer ranks than np after an elastic resume.
        np=result.size if launcher.np > 0 else launcher.np,
        engine=training_engine(config),
        origin=origin,
        run_id=run_id,
        steady_images_per_s=steady,
        val_accuracy=result.final_val_accuracy,
        dataset=dataset.path,
        code_version=package_version(),
        evaluation=result.evaluation,
        client=registry,
    )
    return aliases
