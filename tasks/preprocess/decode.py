"""Executor side of preprocessing: input items in, encoded images or quarantine records out.

``decode_records`` turns the input items of a partition into ``Row``s (the image resized,
converted and PNG-encoded as Petastorm stores it) and ``Bad`` records. It fetches the bytes of
its items (local reads, or ``s3://`` GETs on the partition's one boto3 client, FETCH_AHEAD in
flight while the previous images decode) and decodes each image once: upright and in 8 bits
(``hvdflow.serving.images``, the code the registered model carries: EXIF orientation, CMYK
polarity, 16-bit grayscale).

A bad *file* becomes a ``Bad`` record with a reason a person can act on, so one corrupt image
never fails the job; a file that is no image says what it is (sniff.py: an HTML page left by a
failed download, a JSON error response). An *environment* problem is not a bad file: an input
folder this executor does not see, or an object store it cannot reach, raises
``InputUnreadableError`` naming the host and the path, and fails the job instead of
quarantining every input; on the driver, ``executor_errors`` turns it back into that message.
Scoring (tasks/score/executor.py) reads and decodes its inputs with the same functions.
"""

from __future__ import annotations

import gzip
import os
import re
import socket
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from hvdflow.infra.storage.access import S3Access, error_code
from hvdflow.infra.storage.uris import is_s3, split_s3
from hvdflow.serving.images import UnreadableImage, decode, fit
from hvdflow.tasks.preprocess.schema import image_schema
from hvdflow.tasks.preprocess.sniff import what_it_is
from hvdflow.tasks.preprocess.sources import _open_idx, idx_header_size, parse_idx_header
from hvdflow.tasks.preprocess.split import split_key

# Why a local file is quarantined when this process may not read it.
PERMISSION_DENIED = "permission denied: the file is not readable by this process (chmod a+r it)"
# Why a listed object is quarantined when it is gone by the time it is read.
OBJECT_GONE = "cannot read the object: it no longer exists"
# Objects fetched ahead of the image being decoded, per partition (s3:// inputs).
FETCH_AHEAD = 16


class Good(NamedTuple):
    source: str
    label: str
    image: np.ndarray  # uint8, (H, W) for L, (H, W, 3) for RGB


class Bad(NamedTuple):
    source: str
    reason: str


class Row(NamedTuple):
    """A usable image, ready to store: its label index, split key and PNG bytes."""

    source: str
    label: int
    key: int
    image: bytes


class InputUnreadableError(RuntimeError):
    """An executor cannot read the input at all (not one bad file): the job must fail."""


@contextmanager
def executor_errors():
    """On the driver, around a Spark action: an executor that cannot read the input at all
    fails the job with its InputUnreadableError's message, not Spark's trace."""
    try:
        yield
    except Exception as e:
        found = re.search(rf"{InputUnreadableError.__name__}: (.+)", str(e))
        if found:
            raise RuntimeError(found.group(1).strip()) from e
        raise


@dataclass(frozen=True)
class DecodePlan:
    """What every decode task needs, as plain values (it travels in the Spark closure)."""

    image_size: tuple[int, int]
    color_mode: str
    max_pixels: int
    seed: int
    label_index: dict[str, int]
    root: str  # the input folder (checked on every executor) or s3:// prefix
    access: S3Access | None  # for s3:// inputs


def host() -> str:
    return socket.gethostname()


def check_input_root(root: str) -> None:
    """Fail with the host and the path when this executor does not see the input folder."""
    if not os.path.isdir(root):
        raise InputUnreadableError(
            f"input folder {root!r} does not exist on executor host {host()!r}: on a cluster "
            "the input must be on a path every executor sees (a shared file system mounted at "
            "the same path), or in object storage (s3://bucket/prefix/)"
        )


# --- decoding ------------------------------------------------------------------------------


def decode_image(source: str, label: str, data: bytes, image_size, color_mode, max_pixels):
    """One image file's bytes to a Good record, or a Bad one saying why not (the registered
    model decodes with the same ``hvdflow.serving.images.decode``)."""
    try:
        return Good(source, label, decode(data, image_size, color_mode, max_pixels))
    except UnreadableImage as e:
        return Bad(source, (e.unidentified and what_it_is(data)) or e.reason)


def decode_idx(
    name: str,
    start: int,
    count: int,
    pixels: bytes,
    labels: bytes,
    rows,
    cols,
    image_size,
    color_mode,
):
    """Good records for the complete IDX records in ``pixels``/``labels``, Bad for the rest."""
    from PIL import Image

    complete = min(len(pixels) // (rows * cols), len(labels), count)
    images = np.frombuffer(pixels[: complete * rows * cols], np.uint8).reshape(-1, rows, cols)
    for i in range(complete):
        image = Image.fromarray(images[i], mode="L")
        yield Good(f"{name}#{start + i}", str(labels[i]), fit(image, image_size, color_mode))
    for i in range(complete, count):
        yield Bad(f"{name}#{start + i}", "truncated IDX file")


def decode_item(item, image_size: tuple[int, int], color_mode: str, max_pixels: int):
    """Yield Good/Bad records for a local file item or IDX record range (single process)."""
    fetcher = _Fetcher(None)
    try:
        yield from fetcher.decode(item, fetcher.fetch(item), image_size, color_mode, max_pixels)
    finally:
        fetcher.close()


# --- fetching ------------------------------------------------------------------------------


def fetch_ahead(
    items: Iterable,
    fetch: Callable,
    pool: ThreadPoolExecutor | None,
    alone: Callable[[object], bool] | None = None,
) -> Iterator[tuple]:
    """(item, fetch(item)) for every item, in order. With a ``pool``, up to FETCH_AHEAD fetches
    are in flight while the caller decodes; an item ``alone`` says yes to is fetched in order
    with none in flight beside it (one that takes much memory)."""
    if pool is None:
        for item in items:
            yield item, fetch(item)
        return
    pending: deque = deque()
    for item in items:
        if alone is not None and alone(item):
            while pending:
                first, future = pending.popleft()
                yield first, future.result()
            yield item, fetch(item)
            continue
        pending.append((item, pool.submit(fetch, item)))
        if len(pending) >= FETCH_AHEAD:
            first, future = pending.popleft()
            yield first, future.result()
    while pending:
        first, future = pending.popleft()
        yield first, future.result()


def file_bytes(source: str, path: str, get: Callable[[str], bytes | None]):
    """The bytes of a local file or (through ``get``, e.g. get_object) an object, or a Bad
    saying why they cannot be read."""
    if not is_s3(path):
        try:
            with open(path, "rb") as f:
                return f.read()
        except PermissionError:
            return Bad(source, PERMISSION_DENIED)
        except OSError as e:
            return Bad(source, f"cannot read the file: {e.strerror}")
    data = get(path)
    return Bad(source, OBJECT_GONE) if data is None else data


def get_object(
    client, access: S3Access, uri: str, first: int | None = None, last: int | None = None
) -> bytes | None:
    """An object's bytes (a byte range of it), None when it does not exist; an object store
    this executor may not read or cannot reach raises InputUnreadableError."""
    from botocore.exceptions import BotoCoreError, ClientError

    bucket, key = split_s3(uri)
    kwargs = {"Bucket": bucket, "Key": key}
    if first is not None:
        kwargs["Range"] = f"bytes={first}-{last}"
    try:
        return client.get_object(**kwargs)["Body"].read()
    except ClientError as e:
        code = error_code(e)
        if code in ("NoSuchKey", "404", "NotFound"):
            return None
        if code == "InvalidRange":
            return b""
        raise InputUnreadableError(
            f"executor host {host()!r} cannot read {uri} at {access.where} ({code}): "
            "give the executors credentials for the bucket (AWS_ACCESS_KEY_ID, "
            "AWS_SECRET_ACCESS_KEY)"
        ) from None
    except BotoCoreError as e:
        raise InputUnreadableError(
            f"executor host {host()!r} cannot reach the object store at "
            f"{access.where} to read {uri} ({type(e).__name__}): set AWS_ENDPOINT_URL "
            "to an address the executors can reach"
        ) from None


class _Fetcher:
    """Reads the bytes of input items: local files, or objects through one boto3 client."""

    def __init__(self, access: S3Access | None, client=None):
        self._access = access
        self._client = client
        self._whole: dict[str, bytes] = {}  # gunzipped IDX objects, read once per partition
        self._pool: ThreadPoolExecutor | None = None

    @property
    def client(self):
        if self._client is None:
            self._client = self._access.client(connections=FETCH_AHEAD)
        return self._client

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)

    def fetch_all(self, items):
        """(item, fetched) in order; from object storage with up to FETCH_AHEAD in flight."""
        # Local files: threads would only compete with decoding.
        if self._access is not None and self._pool is None:
            self._pool = ThreadPoolExecutor(FETCH_AHEAD, thread_name_prefix="hvdflow-fetch")
        yield from fetch_ahead(items, self.fetch, self._pool)

    def fetch(self, item):
        """A file's bytes (or a Bad), or for an IDX range (pixels, labels, rows, cols)."""
        if item.problem is not None:  # the listing found it unusable: never read
            return Bad(item.source, item.problem)
        if item.index is None:
            return file_bytes(item.source, item.path, self._get)
        try:
            return self._idx_range(item)
        except (OSError, ValueError, EOFError) as e:
            return Bad(item.source, f"unreadable IDX records: {e}")

    def decode(self, item, fetched, image_size, color_mode, max_pixels):
        if isinstance(fetched, Bad):
            yield fetched
        elif item.index is None:
            yield decode_image(item.source, item.label, fetched, image_size, color_mode, max_pixels)
        else:
            pixels, labels, rows, cols = fetched
            name = item.source.rsplit("#", 1)[0]
            yield from decode_idx(
                name, item.index, item.count, pixels, labels, rows, cols, image_size, color_mode
            )

    def _get(self, uri: str, first: int | None = None, last: int | None = None) -> bytes | None:
        return get_object(self.client, self._access, uri, first, last)

    def _idx_range(self, item):
        if not is_s3(item.path):
            with _open_idx(item.path) as f:
                _, (_, rows, cols) = parse_idx_header(f.read(16), item.path)
                f.seek(16 + item.index * rows * cols)
                pixels = f.read(item.count * rows * cols)
            with _open_idx(item.labels_path) as f:
                f.seek(8 + item.index)
                labels = f.read(item.count)
            return pixels, labels, rows, cols
        if item.path.endswith(".gz"):
            # A gzip stream cannot be read from the middle: fetch and unpack it once per task.
            images, labels_all = self._whole_idx(item.path), self._whole_idx(item.labels_path)
            _, (_, rows, cols) = parse_idx_header(images[:16], item.path)
            size = rows * cols
            start = 16 + item.index * size
            pixels = images[start : start + item.count * size]
            return pixels, labels_all[8 + item.index : 8 + item.index + item.count], rows, cols
        head = self._get(item.path, 0, 15)
        if head is None:
            raise OSError(f"{item.path} no longer exists")
        _, (_, rows, cols) = parse_idx_header(head, item.path)
        size = rows * cols
        start = idx_header_size(3) + item.index * size
        pixels = self._get(item.path, start, start + item.count * size - 1) or b""
        first = idx_header_size(1) + item.index
        labels = self._get(item.labels_path, first, first + item.count - 1) or b""
        return pixels, labels, rows, cols

    def _whole_idx(self, uri: str) -> bytes:
        if uri not in self._whole:
            data = self._get(uri)
            if data is None:
                raise OSError(f"{uri} no longer exists")
            self._whole[uri] = gzip.decompress(data)
        return self._whole[uri]


# --- a partition's records -----------------------------------------------------------------


def decode_records(items, plan: DecodePlan, client=None):
    """Row or Bad records for ``items`` (sources.Item), in order; ``client``: the partition's
    boto3 client, if it has one already."""
    if not is_s3(plan.root):
        check_input_root(plan.root)
    field = image_schema(plan.image_size, plan.color_mode).image
    fetcher = _Fetcher(plan.access, client)
    try:
        for item, fetched in fetcher.fetch_all(items):
            records = fetcher.decode(
                item, fetched, plan.image_size, plan.color_mode, plan.max_pixels
            )
            for record in records:
                if isinstance(record, Bad):
                    yield record
                    continue
                label = plan.label_index.get(record.label)
                if label is None:
                    known = ", ".join(plan.label_index)
                    yield Bad(
                        record.source,
                        f"label {record.label!r} is not one of the classes ({known})",
                    )
                    continue
                image = bytes(field.codec.encode(field, record.image))
                yield Row(record.source, label, split_key(plan.seed, record.source), image)
    finally:
        fetcher.close()
