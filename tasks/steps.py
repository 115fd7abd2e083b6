"""The pipeline's steps as Prefect tasks: retries, caching and run logs around the plain functions.

Retries sit only on the flaky edges: the object store (staging) and the tracking server
(reachability check). Preprocessing is cached by its dataset fingerprint and every result is
persisted, so a rerun after a failed training skips the finished preprocessing and staging.
Inputs are configs and paths, never Spark sessions or clients: Prefect hashes them for caching.
"""

from __future__ import annotations

import contextvars
import hashlib
import threading
import uuid

from prefect import get_run_logger, task
from prefect.cache_policies import INPUTS, TASK_SOURCE, CacheKeyFnPolicy

from hvdflow.infra.launcher import CALLBACK, STDOUT
from hvdflow.infra.storage.object_store import ObjectStoreConfig
from hvdflow.tasks.preprocess import DatasetManifest, PreprocessConfig
from hvdflow.tasks.stage_weights import StagedWeights
from hvdflow.tasks.train import TrainConfig, TrainResult

EDGE_RETRIES = 3
# The Prefect progress artifact that follows a training's epochs (the flow run's Artifacts tab).
TRAINING_PROGRESS_KEY = "hvdflow-training-progress"
EDGE_RETRY_DELAYS_S = [2, 5, 10]


def _spark(master: str | None):
    from hvdflow.infra.spark import get_spark

    return get_spark(master)


def dataset_cache_key(context, parameters) -> str:
    """The dataset fingerprint: same inputs and parameters, same cached result."""
    from hvdflow.tasks.preprocess import sources
    from hvdflow.tasks.preprocess.job import list_inputs

    config: PreprocessConfig = parameters["config"]
    fingerprint = sources.fingerprint(list_inputs(config), config.params())
    where = hashlib.sha256(config.output.encode()).hexdigest()[:8]
    return f"hvdflow-preprocess-{fingerprint}-{where}"


@task(name="preprocess", cache_key_fn=dataset_cache_key, persist_result=True)
def preprocess_step(config: PreprocessConfig, spark_master: str | None = None) -> DatasetManifest:
    from hvdflow.infra.spark import SparkProgress
    from hvdflow.tasks.preprocess import preprocess_images

    logger = get_run_logger()
    spark = _spark(spark_master)
    logger.info("preprocessing %s (%s) into %s", config.input, config.input_format, config.output)
    with SparkProgress(spark, logger):
        manifest = preprocess_images(spark, config)
    logger.info(
        "dataset %s: %d train, %d val, %d quarantined%s",
        manifest.path,
        manifest.train_rows,
        manifest.val_rows,
        manifest.quarantined,
        " (reused)" if manifest.reused else "",
    )
    return manifest


def resolved_source_key(context, parameters) -> str:
    """A cache key part that follows what the weights source refers to now.

    The source may be a reference (``env:NAME``, ``secret:block-name``): one whose value changed
    must not reuse the weights staged from the old value; and a local file is known by its
    content, so new bytes at the same path are staged anew (``source_identity``). Only a hash
    goes into the key; a source that does not resolve, or names no file, gets a key of its own,
    so the task runs and says why.
    """
    from hvdflow.infra.secrets import resolve
    from hvdflow.tasks.stage_weights import source_identity

    try:
        value = resolve(parameters["source"], "training.weights_source")
        return source_identity(
            parameters["model"], value, parameters["input_shape"], parameters["num_classes"]
        )
    except Exception:
        return f"unresolved-{uuid.uuid4().hex}"


@task(
    name="stage-weights",
    retries=EDGE_RETRIES,
    retry_delay_seconds=EDGE_RETRY_DELAYS_S,
    cache_policy=INPUTS + TASK_SOURCE + CacheKeyFnPolicy(cache_key_fn=resolved_source_key),
    persist_result=True,
)
def stage_weights_step(
    model: str,
    source: str,
    store: ObjectStoreConfig,
    input_shape: tuple[int, ...],
    num_classes: int,
) -> StagedWeights:
    from hvdflow.infra.storage.object_store import ObjectStore
    from hvdflow.tasks.stage_weights import stage_weights

    object_store = ObjectStore(store)
    object_store.ensure_bucket()
    # ``source`` may be a reference: stage_weights resolves it, here on the driver, and records
    # only the redacted URL.
    staged = stage_weights(model, source, object_store, input_shape, num_classes)
    get_run_logger().info("weights for %s at %s (sha256 %s)", model, staged.uri, staged.sha256[:12])
    return staged


@task(name="check-tracking-server", retries=EDGE_RETRIES, retry_delay_seconds=EDGE_RETRY_DELAYS_S)
def check_tracking_step(tracking_uri: str) -> None:
    from hvdflow.infra.tracking import check_reachable

    check_reachable(tracking_uri)


@task(name="train", persist_result=True)
def train_step(
    config: TrainConfig,
    dataset: DatasetManifest,
    weights: StagedWeights | None,
    tracking_uri: str,
    spark_master: str | None = None,
) -> TrainResult:
    from hvdflow.tasks.train import train_and_track

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
    from prefect.runtime import flow_run

    result = train_and_track(
        _spark(spark_master),
        config,
        dataset,
        tracking_uri,
        weights=weights,
        on_log_line=forward,
        flow_run_id=flow_run.id,  # a retry of this flow run resumes its MLflow run
    )
    progress.finish()
    return result


class _ProgressArtifact:
    """Prefect's progress artifact for a training: created at 0 % in the task's own thread
    (where the flow run is known), then moved by the epoch lines (``EpochProgress``), which
    arrive on the launcher's reader threads.

    Best effort, like every report of rank output: an API that refuses an update is logged once
    and never fails the training.
    """

    def __init__(self, key: str, what: str, logger):
        from prefect.artifacts import create_progress_artifact

        from hvdflow.tasks.train_progress import EpochProgress

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
        from prefect.artifacts import update_progress_artifact

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


def stage_weights_for(model: str, source: str, dataset: DatasetManifest) -> StagedWeights:
    """Stage ``model``'s weights built for ``dataset``'s image shape and classes (the task).

    A cached result whose object is gone (a bucket emptied, a server replaced at the same
    address) or changed (replaced, corrupted: another ETag) is staged again rather than handed
    to the ranks to fail their checksum on.
    """
    from hvdflow.infra.storage.object_store import ObjectStore
    from hvdflow.tasks.stage_weights import is_intact
    from hvdflow.training.models import model_input_shape

    store = ObjectStoreConfig.from_env()
    args = (model, source, store, model_input_shape(dataset.image_shape), dataset.num_classes)
    staged = stage_weights_step(*args)
    if not is_intact(ObjectStore(store), staged):
        get_run_logger().warning(
            "cached weights %s are gone or changed: staging them again", staged.uri
        )
        staged = stage_weights_step.with_options(refresh_cache=True)(*args)
    return staged


def preprocessed(config: PreprocessConfig, spark_master: str | None = None) -> DatasetManifest:
    """The preprocessing task's dataset. A cached one that is no longer the published dataset
    (its manifest or any of its files gone, or another attempt published since) runs the task
    again: it builds the dataset anew, or picks up the attempt published since."""
    dataset = preprocess_step(config, spark_master)
    if not _still_published(dataset):
        get_run_logger().warning("cached dataset %s is gone: preprocessing again", dataset.path)
        dataset = preprocess_step.with_options(refresh_cache=True)(config, spark_master)
    return dataset


def _still_published(dataset: DatasetManifest) -> bool:
    from hvdflow.tasks.preprocess.job import read_manifest
    from hvdflow.tasks.preprocess.storage import Location

    version = dataset.path.rstrip("/").rsplit("/", 1)[0]  # the manifest sits beside the attempt
    published = read_manifest(Location(version))
    return published is not None and published.path == dataset.path
