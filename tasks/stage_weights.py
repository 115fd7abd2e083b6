"""Step 2: stage pretrained weights once to object storage, content-addressed.

The paper this project grew from hit "too many requests" when 32 to 64 workers each downloaded
Keras application weights from a public host. Here the driver fetches once, stores the file
under its sha256, and every rank loads it from the bucket (``training.weights.fetch_weights``).
A small index object per source makes a second call with the same source neither download nor
upload.
"""

from __future__ import annotations

import base64
import hashlib
import json
import logging
import os
import shutil
import tempfile
import urllib.error
import urllib.request
from dataclasses import asdict, dataclass
from urllib.parse import urlsplit

from infra.secrets import redact_url, resolve, split_userinfo
from infra.storage.locks import cache_root, machine_lock
from infra.storage.object_store import ObjectStore, file_suffix, sha256_file

logger = logging.getLogger(__name__)

# A source that builds the model offline with random weights (``weights=None``): a real weights
# file of the right shape where the public weights cannot be downloaded.
OFFLINE_SOURCE = "keras:weights=None"
DOWNLOAD_TIMEOUT_S = 120


@dataclass(frozen=True)
class StagedWeights:
    model: str
    source: str  # redacted: no credentials, no query string
    uri: str
    sha256: str
    size: int


def redact(source: str) -> str:
    """The source as every record shows it: no user:password, no query string (presigned URLs
    carry tokens there). ``infra.secrets.redact_url``."""
    return redact_url(source)


def stage_weights(
    model: str,
    source: str,
    store: ObjectStore,
    input_shape: tuple[int, ...] | None = None,
    num_classes: int = 10,
) -> StagedWeights:
    """Fetch ``source`` once, store it under its sha256, and return where it lives.

    ``source``: an http(s) URL, a local path (or file:// URL), or ``keras:weights=None`` to build
    ``model`` offline; or a reference to one of them (``env:NAME``, ``secret:block-name``, see
    ``infra.secrets``), resolved here and nowhere else. Concurrent calls for one source on this
    machine download once. The returned sha256 is what ranks verify the file against
    (``training.weights.fetch_weights``): pass it to them, never one read from the object's
    metadata. It is computed here when the file is fetched; a later call takes it from the
    source's index object, so the bucket is trusted between the first staging and the next.
    """
    source = resolve(source, "weights source")
    shape = tuple(input_shape) if input_shape else None
    built = f"\0{shape}\0{num_classes}" if source == OFFLINE_SOURCE else ""
    source_id = hashlib.sha256(f"{model}\0{source}{built}".encode()).hexdigest()
    index_uri = store.config.uri(store.config.key("weights", "sources", f"{source_id}.json"))
    lock = cache_root() / "locks" / f"stage-{source_id}.lock"
    with machine_lock(lock, what=f"staging {model} from {redact(source)}"):
        staged = _from_index(store, index_uri)
        if staged is not None:
            logger.info("weights for %s already staged at %s", model, staged.uri)
            return staged
        with tempfile.TemporaryDirectory(prefix="hvdflow-weights-") as tmp:
            path = _fetch(model, source, tmp, shape, num_classes)
            digest = sha256_file(path)
            size = os.path.getsize(path)
            suffix = file_suffix(path) or ".bin"
            uri = store.config.uri(store.config.key("weights", model, f"{digest}{suffix}"))
            staged = StagedWeights(model, redact(source), uri, digest, size)
            if store.head(uri) is None:
                logger.info("uploading %s weights (%d bytes) to %s", model, size, uri)
                store.upload_file(path, uri, metadata={**asdict(staged), "size": str(size)})
            store.put_bytes(json.dumps(asdict(staged)).encode(), index_uri)
        return staged


def _request(url: str) -> urllib.request.Request:
    """A request for ``url``; user:password in it becomes a Basic auth header."""
    bare, user, password = split_userinfo(url)
    if user is None and password is None:
        return urllib.request.Request(url)
    token = base64.b64encode(f"{user or ''}:{password or ''}".encode())
    return urllib.request.Request(bare, headers={"Authorization": f"Basic {token.decode()}"})


def _from_index(store: ObjectStore, index_uri: str) -> StagedWeights | None:
    if store.head(index_uri) is None:
        return None
    staged = StagedWeights(**json.loads(store.get_bytes(index_uri)))
    head = store.head(staged.uri)
    if head is None or head["size"] != staged.size:
        logger.warning("index %s points at a missing or changed object; staging again", index_uri)
        return None
    return staged


def _fetch(model: str, source: str, workdir: str, input_shape=None, num_classes=10) -> str:
    if source == OFFLINE_SOURCE:
        from training.models import build_model

        path = os.path.join(workdir, f"{model}.weights.h5")
        build_model(model, input_shape, num_classes, seed=0).save_weights(path)
        return path
    scheme = urlsplit(source).scheme
    if scheme in ("http", "https"):
        name = os.path.basename(urlsplit(source).path) or f"{model}.weights"
        path = os.path.join(workdir, name)
        logger.info("downloading %s weights from %s", model, redact(source))
        try:
            with (
                urllib.request.urlopen(_request(source), timeout=DOWNLOAD_TIMEOUT_S) as r,
                open(path, "wb") as f,
            ):
                shutil.copyfileobj(r, f)
        except (urllib.error.URLError, OSError) as e:
            reason = getattr(e, "reason", e)
            raise RuntimeError(
                f"could not download {model} weights from {redact(source)}: {reason}. Check the "
                f"URL, or download the file yourself and pass its path as the source"
            ) from None
        return path
    local = urlsplit(source).path if scheme == "file" else source
    if not os.path.isfile(local):
        raise ValueError(
            f"weights source {redact(source)!r} is neither an http(s) URL, an existing file, nor "
            f"{OFFLINE_SOURCE!r}"
        )
    path = os.path.join(workdir, os.path.basename(local))
    shutil.copyfile(local, path)
    return path
