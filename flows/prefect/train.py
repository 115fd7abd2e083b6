"""Steps 3 and 4's Prefect tasks: the tracking server checked, then the training tracked.

Rank output does not reach Prefect's logs by itself: epoch lines and rank 0's stdout are
forwarded, and a progress artifact follows the epochs. The result is persisted, so a flow run
retried after a later failure does not train again.
"""

from __future__ import annotations

import contextvars
import threading

from prefect import get_run_logger, task
from prefect.artifacts import create_progress_artifact, update_progress_artifact

from hvdflow.flows.prefect.events import CHAMPION_MOVED, champion_moved
from hvdflow.flows.prefect.origin import this_flow_run
from hvdflow.flows.prefect.spark_slots import spark_slots
from hvdflow.infra.launcher import CALLBACK, STDOUT
from hvdflow.infra.tracking import check_reachable
from hvdflow.tasks.edges import EDGE_RETRIES, EDGE_RETRY_DELAYS_S
from hvdflow.tasks.preprocess.config import DatasetManifest
from hvdflow.tasks.train.config import TrainConfig
from hvdflow.tasks.train.progress import EpochProgress
from hvdflow.tasks.train.run import TrainResult, spark_for_ranks, train_and_track
from hvdflow.tasks.weights.stage import StagedWeights

# The Prefect progress artifact that follows a training's epochs (the flow run's Artifacts tab).
TRAINING_PROGRESS_KEY = "hvdflow-training-progress"


@task(name="check-tracking-server", retries=EDGE_RETRIES, retry_delay_seconds=EDGE_RETRY_DELAYS_S)
def check_tracking_step(tracking_uri: str) -> None:
    check_reachable(tracking_uri)


@task(name="train", persist_result=True)
def train_step(
    config: TrainConfig,
    dataset: DatasetManifest,
    weights: StagedWeights | None,
    tracking_uri: str,
    spark_master: str | None = None,
) -> TrainResult:
    logger = get_run_logger()
    progress = _ProgressArtifact(
        TRAINING_PROGRESS_KEY,
        f"training {config.training.model} with np={config.launcher.np}",
        logger,
    )

    def forward(line) -> None:
        # Rank output does not reach Prefect's logs by itself. Epoch lines and rank 0's stdout
        # are what a person follows; the full log is an MLflow artifact.
        if line.stream == CALLBACK or (line.rank == 0 and line.stream == STDOUT):
            logger.info("%s", line.formatted())
        progress.see(line.text)

    logger.info(
        "training %s with np=%d for %d epochs",
        config.training.model,
        config.launcher.np,
        config.training.epochs,
    )

    spark = spark_for_ranks(config.launcher.np, spark_master)
    # The ranks' barrier tasks, in turn with other flows on this cluster (none on the driver).
    with spark_slots(spark, config.launcher.np, f"training with np={config.launcher.np}", logger):
        result = train_and_track(
            spark,
            config,
            dataset,
            tracking_uri,
            weights=weights,
            on_log_line=forward,
            origin=this_flow_run(),  # a retry of this flow run resumes its MLflow run
        )
    progress.finish()
    if result.champion_moved:
        # Registry consumers follow the alias: a deployment trigger can score with it at once.
        champion_moved(config.tracking.registered_model_name, result.model_version, result.run_id)
        logger.info(
            "event %s: %s version %s",
            CHAMPION_MOVED,
            config.tracking.registered_model_name,
            result.model_version,
        )
    return result


class _ProgressArtifact:
    """Prefect's progress artifact for a training: created at 0 % in the task's own thread
    (where the flow run is known), then moved by the epoch lines (``EpochProgress``), which
    arrive on the launcher's reader threads.

    Best effort, like every report of rank output: an API that refuses an update is logged once
    and never fails the training.
    """

    def __init__(self, key: str, what: str, logger):
        self._what, self._logger = what, logger
        self._epochs = EpochProgress()
        self._lock = threading.Lock()
        self._warned = False
        self._id = None
        # Prefect's settings (its API URL among them) live in context variables of the task's
        # thread, which the launcher's reader threads do not inherit: updates run in a copy.
        self._context = contextvars.copy_context()
        try:
            self._id = create_progress_artifact(0.0, key=key, description=self._description())
        except Exception as e:
            self._warn(e)

    def _description(self) -> str:
        return f"{self._what}: {self._epochs.description()}"

    def see(self, text: str) -> None:
        with self._lock:  # ranks' lines arrive on several threads: updates stay in order
            if self._epochs.see(text):
                self._update(self._epochs.percent)

    def finish(self) -> None:
        """The training returned: 100 %."""
        with self._lock:
            self._update(100.0, f"{self._what}: finished")

    def _update(self, percent: float, description: str | None = None) -> None:
        if self._id is None:
            return
        try:
            self._context.copy().run(
                update_progress_artifact,
                self._id,
                percent,
                description=description or self._description(),
            )
        except Exception as e:
            self._warn(e)

    def _warn(self, error: Exception) -> None:
        if not self._warned:
            self._warned = True
            self._logger.warning("training progress not shown in Prefect: %s", error)
