"""Where preprocessing reads and writes: local paths and ``s3://`` objects, the same way on the
driver and on the executors.

Spark's s3a connector cannot be installed here, so executors talk to object storage with boto3:
one client per partition, built from an ``S3Access`` that travels in the Spark closure. It holds
the endpoint and region, and the driver's standard AWS variables when the driver has them
(executors started before the driver set them would not see them otherwise: the reason
HorovodRunner forwards the same variables to its ranks); unset values fall back to the
executor's own credential chain. Credentials are left out of its repr, so they never reach a log.

Files are written whole or not at all: a local file goes to a temporary name and is renamed into
place, an object is uploaded once complete (S3 makes an object visible only when its upload ends).
"""

from __future__ import annotations

import os
import tempfile
import uuid
from contextlib import contextmanager
from dataclasses import dataclass, field
from urllib.parse import urlparse

from hvdflow.infra import constants as c

S3_SCHEME = "s3://"
# Spooled output stays in memory up to this size, then spills to the local temporary folder.
SPOOL_BYTES = 64 << 20


def is_s3(url: str) -> bool:
    return url.startswith(S3_SCHEME)


def split_s3(uri: str) -> tuple[str, str]:
    """``s3://bucket/some/key`` -> ``("bucket", "some/key")``; the key may be empty."""
    parsed = urlparse(uri)
    if parsed.scheme != "s3" or not parsed.netloc:
        raise ValueError(f"{uri!r} is not an object URI: expected s3://BUCKET/PREFIX")
    return parsed.netloc, parsed.path.lstrip("/")


def join(base: str, *parts: str) -> str:
    """``base/part/...`` for a local path or an ``s3://`` URI."""
    if is_s3(base):
        return "/".join([base.rstrip("/"), *(p.strip("/") for p in parts)])
    return os.path.join(base, *parts)


def dataset_url(path: str) -> str:
    """The URL Petastorm opens: ``file://`` for a local folder, the ``s3://`` URI as it is."""
    from pathlib import Path

    return path if is_s3(path) else Path(os.path.abspath(path)).as_uri()


@dataclass(frozen=True)
class S3Access:
    """How to reach the object store: plain values that pickle into a Spark closure."""

    endpoint_url: str | None = None
    region: str = "us-east-1"
    access_key_id: str | None = field(default=None, repr=False)
    secret_access_key: str | None = field(default=None, repr=False)
    session_token: str | None = field(default=None, repr=False)

    @classmethod
    def from_env(cls, store=None) -> S3Access:
        """The endpoint and region of ``store`` (an ObjectStore) or of the AWS variables, and the
        credentials this process has in its environment."""
        from hvdflow.infra.storage.object_store import s3_endpoint

        env = os.environ
        if store is not None:
            endpoint, region = store.config.endpoint_url, store.config.region
        else:
            endpoint = s3_endpoint()
            region = env.get(c.AWS_DEFAULT_REGION) or env.get(c.AWS_REGION) or "us-east-1"
        return cls(
            endpoint_url=endpoint,
            region=region,
            access_key_id=env.get(c.AWS_ACCESS_KEY_ID) or None,
            secret_access_key=env.get(c.AWS_SECRET_ACCESS_KEY) or None,
            session_token=env.get("AWS_SESSION_TOKEN") or None,
        )

    @property
    def where(self) -> str:
        return self.endpoint_url or "AWS S3"

    def client(self, connections: int = 16):
        """A new boto3 S3 client (thread-safe; build one per partition, never pickle one)."""
        import boto3
        from botocore.config import Config

        session = boto3.session.Session(
            aws_access_key_id=self.access_key_id,
            aws_secret_access_key=self.secret_access_key,
            aws_session_token=self.session_token,
        )
        return session.client(
            "s3",
            endpoint_url=self.endpoint_url,
            region_name=self.region,
            config=Config(
                connect_timeout=5,
                read_timeout=60,
                retries={"max_attempts": 4, "mode": "standard"},
                max_pool_connections=connections,
                s3={"addressing_style": "path"},
            ),
        )


def error_code(error: Exception) -> str:
    """The S3 error code of a botocore ClientError (``NoSuchKey``, ``AccessDenied``...), else
    the exception's class name."""
    response = getattr(error, "response", None)
    if isinstance(response, dict):
        return str(response.get("Error", {}).get("Code", "")) or type(error).__name__
    return type(error).__name__


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
        if not is_s3(self.base):
            return {
                os.path.relpath(os.path.join(folder, name), self.base)
                for folder, _dirs, names in os.walk(self.base)
                for name in names
            }
        prefix = split_s3(self.base + "/")[1]
        return {
            obj["Key"][len(prefix) :]
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
            import shutil

            shutil.rmtree(url, ignore_errors=True)
            return
        bucket, prefix = split_s3(url + "/")
        pages = self.client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
        for page in pages:
            keys = [{"Key": o["Key"]} for o in page.get("Contents", [])]
            if keys:
                self.client.delete_objects(Bucket=bucket, Delete={"Objects": keys, "Quiet": True})
