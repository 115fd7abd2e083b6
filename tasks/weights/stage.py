"""Step 2: stage pretrained weights once to object storage, content-addressed.

32 to 64 workers each downloading Keras weights from a public host get "too many requests".
Here the driver fetches once, stores the file under its sha256, and every rank loads it from
the bucket (``hvdflow.training.weights.fetch_weights``). An index object per source makes a
second call neither download nor upload; it records the object's ETag, so an object replaced
since is staged again. A local file is known by its content, not its path.
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
from dataclasses import asdict, dataclass, replace
from urllib.parse import urlsplit

from hvdflow.infra._env import temporary_env
from hvdflow.infra.connect import default_master, is_connect_url
from hvdflow.infra.constants import FORWARDED_TO_RANKS
from hvdflow.infra.progress import ByteProgress, human_bytes
from hvdflow.infra.secrets import resolve, split_userinfo
from hvdflow.infra.storage.locks import cache_root, machine_lock
from hvdflow.infra.storage.object_store import (
    ObjectStore,
    ObjectStoreConfig,
    file_suffix,
    sha256_file,
)
from hvdflow.tasks.weights.source import OFFLINE_SOURCE, redact
from hvdflow.training.frameworks import framework
from hvdflow.training.models import build_model, model_input_shape

logger = logging.getLogger(__name__)

DOWNLOAD_TIMEOUT_S = 120


@dataclass(frozen=True)
class StagedWeights:
    model: str
    source: str  # redacted: no credentials, no query string
    uri: str
    sha256: str
    size: int
    # The object's ETag once uploaded: another one means the object was replaced since.
    etag: str = ""


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
    ``hvdflow.infra.secrets``), resolved here and nowhere else. Concurrent calls for one source on
    this machine download once. Ranks verify the file against the returned sha256: pass it to
    them, never one read from the object's metadata.
    """
    source = resolve(source, "weights source")
    shape = tuple(input_shape) if input_shape else None
    local = _local_file(source)
    content = sha256_file(local) if local else None
    identity = _identity(model, source, shape, num_classes, content)
    index_uri = store.config.uri(store.config.key("weights", "sources", f"{identity}.json"))
    lock = cache_root() / "locks" / f"stage-{identity}.lock"
    with machine_lock(lock, what=f"staging {model} from {redact(source)}"):
        staged = _from_index(store, index_uri)
        if staged is not None:
            logger.info("weights for %s already staged at %s", model, staged.uri)
            return replace(staged, source=redact(source))  # the same bytes, maybe another path
        with tempfile.TemporaryDirectory(prefix="hvdflow-weights-") as tmp:
            staged = _upload(store, model, source, _fetch(model, source, tmp, shape, num_classes))
        if content is not None and staged.sha256 != content:
            raise RuntimeError(
                f"weights file {redact(source)} changed while it was staged (sha256 {content} "
                f"when first read, {staged.sha256} when copied): stage it again once it is "
                "written"
            )
        store.put_bytes(json.dumps(asdict(staged)).encode(), index_uri)
        return staged


def source_identity(
    model: str, source: str, input_shape: tuple[int, ...] | None = None, num_classes: int = 10
) -> str:
    """What the staged copy of ``source`` (resolved) is known by, in the bucket's index and the
    flow's cache: a local file by its sha256, a URL by itself, the offline build by its shape
    and classes."""
    local = _local_file(source)
    content = sha256_file(local) if local else None
    shape = tuple(input_shape) if input_shape else None
    return _identity(model, source, shape, num_classes, content)


def is_intact(store: ObjectStore, staged: StagedWeights) -> bool:
    """Whether the object is still the one staged: there, with its size and ETag (the ranks
    check the bytes themselves against ``sha256``)."""
    head = store.head(staged.uri)
    return (
        head is not None
        and head["size"] == staged.size
        and bool(staged.etag)
        and head["etag"] == staged.etag
    )


def _identity(model: str, source: str, shape, num_classes: int, content: str | None) -> str:
    if content is not None:
        what = f"sha256:{content}"
    elif source == OFFLINE_SOURCE:
        what = f"{source}\0{shape}\0{num_classes}"
    else:
        what = source  # the key URLs always had: what was staged from them still counts
    return hashlib.sha256(f"{model}\0{what}".encode()).hexdigest()


def _upload(store: ObjectStore, model: str, source: str, path: str) -> StagedWeights:
    """Upload ``path`` under its sha256, whatever is there (a miss of the index may be a
    corrupt object)."""
    digest = sha256_file(path)
    size = os.path.getsize(path)
    uri = store.config.uri(
        store.config.key("weights", model, f"{digest}{file_suffix(path) or '.bin'}")
    )
    staged = StagedWeights(model, redact(source), uri, digest, size)
    logger.info("uploading %s weights (%s) to %s", model, human_bytes(size), uri)
    metadata = {**asdict(staged), "size": str(size)}
    metadata.pop("etag")
    progress = ByteProgress(f"uploading {model} weights", size, logger.info)
    store.upload_file(path, uri, metadata=metadata, progress=progress)
    progress.finish()
    head = store.head(uri)
    return replace(staged, etag=head["etag"] if head else "")


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
    if not is_intact(store, staged):
        logger.warning("index %s points at a missing or changed object; staging again", index_uri)
        return None
    return staged


def _local_file(source: str) -> str | None:
    """The local file ``source`` names; None for a URL or the offline build; else ValueError."""
    if source == OFFLINE_SOURCE:
        return None
    scheme = urlsplit(source).scheme
    if scheme in ("http", "https"):
        return None
    local = urlsplit(source).path if scheme == "file" else source
    if not os.path.isfile(local):
        raise ValueError(
            f"weights source {redact(source)!r} is neither an http(s) URL, an existing file, nor "
            f"{OFFLINE_SOURCE!r}"
        )
    return local


def _fetch(model: str, source: str, workdir: str, input_shape=None, num_classes=10) -> str:
    if source == OFFLINE_SOURCE:
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
                length = r.headers.get("Content-Length")
                total = int(length) if length and length.isdigit() else None
                _copy(r, f, ByteProgress(f"downloading {model} weights", total, logger.info))
        except (urllib.error.URLError, OSError) as e:
            reason = getattr(e, "reason", e)
            raise RuntimeError(
                f"could not download {model} weights from {redact(source)}: {reason}. Check the "
                f"URL, or download the file yourself and pass its path as the source"
            ) from None
        return path
    local = _local_file(source)
    path = os.path.join(workdir, os.path.basename(local))
    shutil.copyfile(local, path)
    return path


def _copy(source, target, progress: ByteProgress, chunk: int = 1 << 20) -> None:
    """Copy file object ``source`` into ``target``, reporting each chunk to ``progress``."""
    while block := source.read(chunk):
        target.write(block)
        progress(len(block))
    progress.finish()


def weights_wanted(training) -> bool:
    """Whether a training (``TrainingParams``) names a source its framework loads (PyTorch
    models train from their seeded start)."""
    return bool(training.weights_source) and framework(training.framework).stages_weights


def staging_inputs(dataset) -> tuple[tuple[int, ...], int]:
    """The model input shape and class count weights for ``dataset`` (a DatasetManifest) fit."""
    return model_input_shape(dataset.image_shape), dataset.num_classes


def stage_into(
    config: ObjectStoreConfig,
    model: str,
    source: str,
    input_shape,
    num_classes: int,
    spark_master: str | None = None,
) -> StagedWeights:
    """``stage_weights`` into the bucket of ``config`` (made if missing): each face's staging
    step. Through Spark Connect (``spark_master``, else the default master, is ``sc://``), the
    offline build runs in a Spark task: the orchestrator's worker then needs no TensorFlow.
    """
    if source == OFFLINE_SOURCE and is_connect_url(spark_master or default_master()):
        return _stage_on_executor(config, model, input_shape, num_classes, spark_master)
    return _stage_here(config, model, source, input_shape, num_classes)


def _stage_here(
    config: ObjectStoreConfig, model: str, source: str, input_shape, num_classes: int
) -> StagedWeights:
    """``stage_weights`` in this process, into the bucket of ``config`` (made if missing)."""
    store = ObjectStore(config)
    store.ensure_bucket()
    return stage_weights(model, source, store, input_shape, num_classes)


def _stage_on_executor(
    config: ObjectStoreConfig, model: str, input_shape, num_classes: int, spark_master
) -> StagedWeights:
    """``stage_into`` of the offline build, in one Spark task, given the driver's object-store
    variables (``FORWARDED_TO_RANKS``: in the closure, never logged)."""
    from hvdflow.infra.spark import get_spark  # noqa: PLC0415 (lazy: it loads Spark)
    from hvdflow.infra.spark_map import map_slices  # noqa: PLC0415 (lazy: it loads Spark)

    env = {k: os.environ[k] for k in FORWARDED_TO_RANKS if k in os.environ}
    logger.info("building %s's initial weights in a Spark task (Spark Connect)", model)
    (staged,) = map_slices(
        get_spark(spark_master),
        [(config, model, input_shape, num_classes, env)],
        _stage_slices,
        f"hvdflow: building {model}'s initial weights",
    )
    return staged


def _stage_slices(slices):
    """``map_slices``' function on the executor: stage each (config, model, shape, classes, env)."""
    for config, model, input_shape, num_classes, env in slices:
        with temporary_env(env):
            yield _stage_here(config, model, OFFLINE_SOURCE, input_shape, num_classes)
