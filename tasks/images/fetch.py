"""Executor side: the bytes of listed items, read by one ``Fetcher`` per task, and decoded.

A task's ``Fetcher`` reads local files; ``s3://`` objects through the task's one boto3 client,
FETCH_AHEAD GETs in flight while earlier images decode; IDX record ranges (a gzipped object
unpacked once per task); and Parquet row groups, one at a time (each may be tens of MB).

A bad *file* becomes a ``Bad`` record. An *environment* problem (an input folder this executor
does not see, an object store it cannot reach) raises ``InputUnreadableError`` naming the host
and path, and fails the job instead of quarantining every input.
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

from hvdflow.infra.storage.access import S3Access, error_code
from hvdflow.infra.storage.uris import is_s3, split_s3
from hvdflow.tasks.images.decode import Bad, decode_idx, decode_image
from hvdflow.tasks.images.listing import Item, idx_header_size, open_idx, parse_idx_header
from hvdflow.tasks.images.parquet import read_row_group

# Why a local file is quarantined when this process may not read it.
PERMISSION_DENIED = "permission denied: the file is not readable by this process (chmod a+r it)"
# Why a listed object is quarantined when it is gone by the time it is read.
OBJECT_GONE = "cannot read the object: it no longer exists"
# Objects fetched ahead of the image being decoded, per task (s3:// inputs).
FETCH_AHEAD = 16


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


def fetch_ahead(
    items: Iterable,
    fetch: Callable,
    pool: ThreadPoolExecutor | None,
    alone: Callable[[object], bool] | None = None,
) -> Iterator[tuple]:
    """(item, fetch(item)) for every item, in order; with a ``pool``, up to FETCH_AHEAD in
    flight, except an item ``alone`` says yes to (one that takes much memory)."""
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
    """The bytes of a local file or (through ``get``) an object, or a Bad saying why not."""
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


class Fetcher:
    """Reads and decodes the listed items of one task, in order; close it to stop the fetches
    in flight. ``access``: the object store of ``s3://`` inputs; None for local ones, fetched
    none ahead (threads would compete with decoding). ``client``: the task's boto3 client."""

    def __init__(self, access: S3Access | None, client=None):
        self._access = access
        self._client = client
        self._whole: dict[str, bytes] = {}  # gunzipped IDX objects, read once per task
        self._pool: ThreadPoolExecutor | None = None

    def __enter__(self) -> Fetcher:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    @property
    def client(self):
        if self._client is None:
            self._client = self._access.client(connections=FETCH_AHEAD)
        return self._client

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)

    def records(self, items: Iterable[Item], image_size, color_mode: str, max_pixels: int):
        """Good or Bad records (decode.py) of every item, in order."""
        for item, fetched in self.fetch_all(items):
            yield from self.decode(item, fetched, image_size, color_mode, max_pixels)

    def fetch_all(self, items: Iterable[Item]):
        """(item, fetched) in order: see ``fetch_ahead``."""
        if self._access is not None and self._pool is None:
            self._pool = ThreadPoolExecutor(FETCH_AHEAD, thread_name_prefix="hvdflow-fetch")
        yield from fetch_ahead(items, self.fetch, self._pool, alone=_is_row_group)

    def fetch(self, item: Item):
        """A file's bytes (or a Bad); for an IDX range (pixels, labels, rows, cols); for a row
        group (sources, encoded images)."""
        if item.problem is not None:  # the listing found it unusable: never read
            return Bad(item.source, item.problem)
        if item.row_group is not None:
            return read_row_group(item.path, item.row_group, self._access)
        if item.index is None:
            return file_bytes(item.source, item.path, self._get)
        try:
            return self._idx_range(item)
        except (OSError, ValueError, EOFError) as e:
            return Bad(item.source, f"unreadable IDX records: {e}")

    @staticmethod
    def decode(item: Item, fetched, image_size, color_mode: str, max_pixels: int):
        """The records of one fetched item."""
        if isinstance(fetched, Bad):
            yield fetched
        elif item.row_group is not None:
            for source, data in zip(*fetched, strict=True):
                yield decode_image(
                    source, item.label, data or b"", image_size, color_mode, max_pixels
                )
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

    def _idx_range(self, item: Item):
        if not is_s3(item.path):
            with open_idx(item.path) as f:
                _, (_, rows, cols) = parse_idx_header(f.read(16), item.path)
                f.seek(16 + item.index * rows * cols)
                pixels = f.read(item.count * rows * cols)
            with open_idx(item.labels_path) as f:
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


def _is_row_group(item: Item) -> bool:
    return item.row_group is not None


def decode_item(item: Item, image_size: tuple[int, int], color_mode: str, max_pixels: int):
    """Good/Bad records for a local file item or IDX record range (one process, no Spark)."""
    with Fetcher(None) as fetcher:
        yield from fetcher.decode(item, fetcher.fetch(item), image_size, color_mode, max_pixels)
