"""Rank side of weight staging: load weights from the bucket through a per-machine cache."""

from __future__ import annotations

import logging
import os
import tempfile

from hvdflow.infra.storage.locks import cache_root, machine_lock
from hvdflow.infra.storage.object_store import (
    ObjectStore,
    ObjectStoreError,
    file_suffix,
    sha256_file,
)

logger = logging.getLogger(__name__)


def fetch_weights(uri: str, sha256: str, store: ObjectStore | None = None) -> str:
    """A local path to the object at ``uri``, verified against ``sha256``.

    ``sha256`` is the one the driver computed when it staged the weights (``StagedWeights``,
    passed in the rank's arguments), never one read from the bucket: an object replaced there,
    metadata and all, fails the check. Ranks on one machine share the cache and download once. A
    checksum mismatch downloads once more, then fails naming the URI; the source the weights came
    from is never contacted.
    """
    store = store or ObjectStore()
    suffix = file_suffix(uri)
    cache_dir = cache_root() / "weights"
    path = cache_dir / f"{sha256}{suffix}"
    with machine_lock(cache_dir / f"{sha256}.lock", what=f"the weights cache for {uri}"):
        if path.exists() and sha256_file(str(path)) == sha256:
            return str(path)
        got = None
        for attempt in (1, 2):
            fd, tmp = tempfile.mkstemp(dir=cache_dir, suffix=".part")
            os.close(fd)
            try:
                store.download_file(uri, tmp)
                got = sha256_file(tmp)
                if got == sha256:
                    os.replace(tmp, path)
                    return str(path)
            finally:
                if os.path.exists(tmp):
                    os.remove(tmp)
            if attempt == 1:
                logger.warning("%s: checksum mismatch (got %s), downloading again", uri, got)
        raise ObjectStoreError(
            f"{uri} does not match its checksum after two downloads (expected sha256 {sha256}, "
            f"got {got}): the object in the bucket is corrupt or was replaced; stage the weights "
            "again"
        )
