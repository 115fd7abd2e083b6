"""Where the steps' results and cache records live: in the object store, for every worker.

Prefect keeps task results, and the records its caches are looked up by, in the flow process's
local storage by default: a rerun on another worker would preprocess and stage again. With an
object store configured (the standard AWS variables; ``hvdflow up``'s SeaweedFS by default) they
go to ``s3://<bucket>/<prefix>/prefect-results`` instead, through a Prefect ``RemoteFileSystem``
block. Prefect needs the block saved on its server; it holds the bucket path and the endpoint,
never a credential (s3fs reads those from the standard AWS variables where the flow runs).
"""

from __future__ import annotations

import hashlib
import json
import os

from prefect.filesystems import RemoteFileSystem

from hvdflow.infra import constants as c
from hvdflow.infra.storage.access import s3_endpoint
from hvdflow.infra.storage.object_store import ObjectStore, ObjectStoreConfig

RESULTS_PREFIX = "prefect-results"
BLOCK_PREFIX = "hvdflow-results"


def shared_result_storage() -> RemoteFileSystem | None:
    """The object store's results block (saved on the Prefect server), or None where no object
    store is configured (results stay in Prefect's local storage)."""
    if not (s3_endpoint() or os.environ.get(c.AWS_ACCESS_KEY_ID)):
        return None
    store = ObjectStoreConfig.from_env()
    ObjectStore(store).ensure_bucket()
    basepath = f"s3://{store.bucket}/{store.key(RESULTS_PREFIX)}"
    settings = {"client_kwargs": {"endpoint_url": store.endpoint_url}} if store.endpoint_url else {}
    # One block per place: a name of its own, so runs against other buckets never overwrite it.
    digest = hashlib.sha256(json.dumps([basepath, settings]).encode()).hexdigest()[:12]
    name = f"{BLOCK_PREFIX}-{digest}"
    block = RemoteFileSystem(basepath=basepath, settings=settings)
    try:
        block.save(name, overwrite=False)
    except ValueError:  # saved already, by an earlier run or one started at the same moment
        block = RemoteFileSystem.load(name)
    return block
