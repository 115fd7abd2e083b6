"""Files under a local folder or an ``s3://`` prefix, read and written the same way on the
driver and on the executors.

Files are written whole or not at all: a local file goes to a temporary name and is renamed into
place, an object is uploaded once complete (S3 makes an object visible only when its upload ends).
"""

from __future__ import annotations

import os
import shutil
import tempfile
import uuid
from contextlib import contextmanager

from hvdflow.infra.storage.access import S3Access, error_code
from hvdflow.infra.storage.uris import is_s3, join, split_s3

# Spooled output stays in memory up to this size, then spills to the local temporary folder.
SPOOL_BYTES = 64 << 20


def list_objects(client, uri: str, access: S3Access, delimiter: str | None = None):
    """Every object under ``uri`` (paginated ListObjectsV2): dicts with Key, Size and ETag;
    with ``delimiter``, the objects at the top level only."""
    from botocore.exceptions import BotoCoreError, ClientError

    bucket, prefix = split_s3(uri)
    if prefix and not prefix.endswith("/"):
        prefix += "/"
    kwargs = {"Bucket": bucket, "Prefix": prefix}
    if delimiter:
        kwargs["Delimiter"] = delimiter
    try:
        for page in client.get_paginator("list_objects_v2").paginate(**kwargs):
            yield from page.get("Contents", [])
    except ClientError as e:
        code = error_code(e)
        if code == "NoSuchBucket":
            raise ValueError(
                f"input {uri!r}: bucket {bucket!r} does not exist at {access.where}: check the "
                "URI, or AWS_ENDPOINT_URL for another object store"
            ) from None
        raise RuntimeError(
            f"cannot list {uri} at {access.where} ({code}): check AWS_ACCESS_KEY_ID and "
            "AWS_SECRET_ACCESS_KEY"
        ) from None
    except BotoCoreError as e:
        raise RuntimeError(
            f"cannot list {uri}: the object store at {access.where} is unreachable "
            f"({type(e).__name__}): start it, or set AWS_ENDPOINT_URL"
        ) from None


class _Keep:
    """A file object whose close() is left to its owner (pyarrow's writers call it)."""

    def __init__(self, raw):
        self._raw = raw

    def __getattr__(self, name):
        return getattr(self._raw, name)

    def close(self):
        pass

    @property
    def closed(self):
        return self._raw.closed


@contextmanager
def open_for_write(url: str, access: S3Access | None = None, client=None):
    """A binary file whose content appears at ``url`` only if the block ends without error.

    Local: a temporary name in the same folder, renamed into place. ``s3://``: spooled in
    memory (spilling to the local temporary folder past SPOOL_BYTES), uploaded at the end.
    """
    if not is_s3(url):
        os.makedirs(os.path.dirname(url) or ".", exist_ok=True)
        partial = f"{url}.partial-{uuid.uuid4().hex[:8]}"
        try:
            with open(partial, "wb") as f:
                yield _Keep(f)
            os.replace(partial, url)
        finally:
            if os.path.exists(partial):
                os.remove(partial)
        return
    bucket, key = split_s3(url)
    with tempfile.SpooledTemporaryFile(max_size=SPOOL_BYTES) as f:
        yield _Keep(f)
        f.seek(0)
        (client or access.client()).upload_fileobj(f, bucket, key)


class Location:
    """The driver's view of a folder or prefix: read, write whole files, list, remove."""

    def __init__(self, base: str, access: S3Access | None = None):
        self.base = base.rstrip("/") if is_s3(base) else os.path.abspath(base)
        self.access = (
            access if access is not None else (S3Access.from_env() if is_s3(base) else None)
        )
        self._client = None

    @property
    def client(self):
        if self._client is None:
            self._client = self.access.client()
        return self._client

    def join(self, *parts: str) -> str:
        return join(self.base, *parts)

    def read_bytes(self, name: str) -> bytes | None:
        """The file's content, or None when it does not exist."""
        url = self.join(name)
        if not is_s3(url):
            try:
                with open(url, "rb") as f:
                    return f.read()
            except FileNotFoundError:
                return None
        from botocore.exceptions import ClientError

        bucket, key = split_s3(url)
        try:
            return self.client.get_object(Bucket=bucket, Key=key)["Body"].read()
        except ClientError as e:
            if error_code(e) in ("NoSuchKey", "404", "NotFound"):
                return None
            raise RuntimeError(
                f"cannot read {url} at {self.access.where}: {error_code(e)}"
            ) from None

    def write_bytes(self, name: str, data: bytes) -> str:
        url = self.join(name)
        with open_for_write(url, self.access, self._client_if_s3()) as f:
            f.write(data)
        return url

    def open_for_write(self, name: str):
        return open_for_write(self.join(name), self.access, self._client_if_s3())

    def _client_if_s3(self):
        return self.client if is_s3(self.base) else None

    def iter_lines(self, name: str):
        """The file's lines (text, without line ends), streamed."""
        url = self.join(name)
        if not is_s3(url):
            with open(url, encoding="utf-8", newline="") as f:
                for line in f:
                    yield line.rstrip("\r\n")
            return
        bucket, key = split_s3(url)
        body = self.client.get_object(Bucket=bucket, Key=key)["Body"]
        for line in body.iter_lines():
            yield line.decode("utf-8").rstrip("\r")

    def files(self) -> set[str]:
        """Relative names (``train/part-00000.parquet``) of every file under it, at any depth."""
        return set(self.signatures())

    def signatures(self) -> dict[str, str]:
        """Every file under it, at any depth, by relative name, with what changes when its bytes
        are rewritten: an object's ETag (a digest of its content), a local file's size and
        modification time. One listing; no file is read."""
        if not is_s3(self.base):
            found = {}
            for folder, _dirs, names in os.walk(self.base):
                for name in names:
                    path = os.path.join(folder, name)
                    stat = os.stat(path)
                    found[os.path.relpath(path, self.base)] = f"{stat.st_size}:{stat.st_mtime_ns}"
            return found
        prefix = split_s3(self.base + "/")[1]
        return {
            obj["Key"][len(prefix) :]: obj["ETag"].strip('"')
            for obj in list_objects(self.client, self.base, self.access)
            if not obj["Key"].endswith("/")
        }

    def subfolders(self) -> list[str]:
        """Names of the folders directly inside (common prefixes for ``s3://``)."""
        if not is_s3(self.base):
            if not os.path.isdir(self.base):
                return []
            return sorted(e.name for e in os.scandir(self.base) if e.is_dir())
        bucket, prefix = split_s3(self.base + "/")
        names = []
        pages = self.client.get_paginator("list_objects_v2").paginate(
            Bucket=bucket, Prefix=prefix, Delimiter="/"
        )
        for page in pages:
            names += [
                p["Prefix"][len(prefix) :].rstrip("/") for p in page.get("CommonPrefixes", [])
            ]
        return sorted(names)

    def remove_tree(self, name: str) -> None:
        """Delete a folder (every object under the prefix) and everything in it."""
        url = self.join(name)
        if not is_s3(url):
            shutil.rmtree(url, ignore_errors=True)
            return
        bucket, prefix = split_s3(url + "/")
        pages = self.client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
        for page in pages:
            keys = [{"Key": o["Key"]} for o in page.get("Contents", [])]
            if keys:
                self.client.delete_objects(Bucket=bucket, Delete={"Objects": keys, "Quiet": True})
