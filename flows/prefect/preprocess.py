"""Step 1's Prefect task: preprocessing cached by its dataset fingerprint.

Inputs are configs and paths, never Spark sessions or clients: Prefect hashes them for caching,
and the result is persisted, so a rerun after a failed training skips a finished preprocessing.
"""

from __future__ import annotations

import hashlib

from prefect import get_run_logger, task

from hvdflow.infra.spark import get_spark
from hvdflow.infra.storage.files import Location
from hvdflow.tasks.preprocess import sources
from hvdflow.tasks.preprocess.config import DatasetManifest, PreprocessConfig
from hvdflow.tasks.preprocess.job import list_inputs, preprocess_reported
from hvdflow.tasks.preprocess.publish import read_manifest


def dataset_cache_key(context, parameters) -> str:
    """The dataset fingerprint: same inputs and parameters, same cached result."""
    config: PreprocessConfig = parameters["config"]
    fingerprint = sources.fingerprint(list_inputs(config), config.params())
    where = hashlib.sha256(config.output.encode()).hexdigest()[:8]
    return f"hvdflow-preprocess-{fingerprint}-{where}"


@task(name="preprocess", cache_key_fn=dataset_cache_key, persist_result=True)
def preprocess_step(config: PreprocessConfig, spark_master: str | None = None) -> DatasetManifest:
    return preprocess_reported(lambda: get_spark(spark_master), config, get_run_logger())


def preprocessed(
    config: PreprocessConfig, spark_master: str | None = None, result_storage=None
) -> DatasetManifest:
    """The preprocessing task's dataset. A cached one that is no longer the published dataset
    (its manifest or any of its files gone, a file rewritten, or another attempt published
    since) runs the task
    again: it builds the dataset anew, or picks up the attempt published since.

    ``result_storage``: where the result and its cache record go (``results``)."""
    step = preprocess_step.with_options(result_storage=result_storage)
    dataset = step(config, spark_master)
    if not _still_published(dataset):
        get_run_logger().warning(
            "cached dataset %s is gone or changed: preprocessing again", dataset.path
        )
        dataset = step.with_options(refresh_cache=True)(config, spark_master)
    return dataset


def _still_published(dataset: DatasetManifest) -> bool:
    version = dataset.path.rstrip("/").rsplit("/", 1)[0]  # the manifest sits beside the attempt
    published = read_manifest(Location(version))
    return published is not None and published.path == dataset.path
