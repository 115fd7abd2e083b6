"""Step 2's Prefect task: weights staged once per source, retried on the object store's edge.

The cache key follows what the source refers to now (a reference's value, a local file's
bytes), and a cached result whose object is gone or changed is staged again.
"""

from __future__ import annotations

import uuid

from prefect import get_run_logger, task
from prefect.cache_policies import INPUTS, TASK_SOURCE, CacheKeyFnPolicy

from hvdflow.infra.secrets import resolve
from hvdflow.infra.storage.object_store import ObjectStore, ObjectStoreConfig
from hvdflow.tasks.edges import EDGE_RETRIES, EDGE_RETRY_DELAYS_S
from hvdflow.tasks.preprocess.config import DatasetManifest
from hvdflow.tasks.weights.stage import (
    StagedWeights,
    is_intact,
    source_identity,
    stage_into,
    staging_inputs,
)


def resolved_source_key(context, parameters) -> str:
    """A cache key part that follows what the weights source refers to now.

    The source may be a reference (``env:NAME``, ``secret:block-name``): one whose value changed
    must not reuse the weights staged from the old value; and a local file is known by its
    content, so new bytes at the same path are staged anew (``source_identity``). Only a hash
    goes into the key; a source that does not resolve, or names no file, gets a key of its own,
    so the task runs and says why.
    """
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
    spark_master: str | None = None,
) -> StagedWeights:
    # ``source`` may be a reference: stage_weights resolves it, here on the driver, and records
    # only the redacted URL. Through Spark Connect the offline build runs on an executor.
    staged = stage_into(store, model, source, input_shape, num_classes, spark_master)
    get_run_logger().info("weights for %s at %s (sha256 %s)", model, staged.uri, staged.sha256[:12])
    return staged


def stage_weights_for(
    model: str,
    source: str,
    dataset: DatasetManifest,
    result_storage=None,
    *,
    spark_master: str | None = None,
) -> StagedWeights:
    """Stage ``model``'s weights built for ``dataset``'s image shape and classes (the task).

    A cached result whose object is gone (a bucket emptied, a server replaced at the same
    address) or changed (replaced, corrupted: another ETag) is staged again rather than handed
    to the ranks to fail their checksum on.
    """
    store = ObjectStoreConfig.from_env()
    args = (model, source, store, *staging_inputs(dataset), spark_master)
    step = stage_weights_step.with_options(result_storage=result_storage)
    staged = step(*args)
    if not is_intact(ObjectStore(store), staged):
        get_run_logger().warning(
            "cached weights %s are gone or changed: staging them again", staged.uri
        )
        staged = step.with_options(refresh_cache=True)(*args)
    return staged
