"""S3-compatible object storage over boto3: real S3, or the embedded SeaweedFS server.

The endpoint comes from ``AWS_ENDPOINT_URL_S3`` / ``AWS_ENDPOINT_URL`` (unset: real S3),
credentials from boto3's usual chain, bucket and prefix from ``HVDFLOW_BUCKET`` and
``HVDFLOW_PREFIX``. Credentials are never part of the config object, so they cannot reach logs,
MLflow params or Prefect parameters.

Every failed call is one ObjectStoreError naming the endpoint, what was being done and the
variable to fix; never a secret, never botocore's traceback.
"""

from __future__ import annotations

import hashlib
import logging
import os
from collections.abc import Callable
from urllib.parse import urlparse

from boto3.exceptions import RetriesExceededError, S3UploadFailedError
from botocore.exceptions import (
    BotoCoreError,
    ClientError,
    ConnectTimeoutError,
    NoCredentialsError,
    ReadTimeoutError,
)
from botocore.exceptions import ConnectionError as BotoConnectionError
from pydantic import BaseModel, ConfigDict, Field, field_validator

from hvdflow.infra import constants as c
from hvdflow.infra.errors import TransientError
from hvdflow.infra.storage.access import S3Access, s3_endpoint
from hvdflow.infra.storage.uris import parse_uri

logger = logging.getLogger(__name__)

# Attempts (with botocore's exponential backoff) before an unreachable store is an error.
DEFAULT_ATTEMPTS = 4
_CHUNK = 1 << 20


class ObjectStoreError(RuntimeError):
    """The object store could not be reached, or an object is missing or corrupt.

    ``missing``: the store answered that the object or bucket does not exist. ``transient``: the
    store did not answer; such an error is an ``ObjectStoreUnreachableError``.
    """

    def __init__(self, message: str, *, missing: bool = False, transient: bool = False):
        super().__init__(message)
        self.missing = missing
        self.transient = transient


class ObjectStoreUnreachableError(ObjectStoreError, TransientError):
    """The store did not answer: a ``TransientError``, so the training runs another attempt."""

    def __init__(self, message: str):
        super().__init__(message, transient=True)


# Error codes with which S3 servers refuse a request's key or signature; a HEAD request's error
# has no body, so only its status code ("403") comes back.
DENIED_CODES = frozenset(
    {"403", "AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch", "InvalidToken"}
)


def _underlying(error: BaseException) -> BaseException:
    """The error boto3's transfer wrappers hide (S3UploadFailedError's context,
    RetriesExceededError's last attempt)."""
    if isinstance(error, S3UploadFailedError) and error.__context__ is not None:
        return error.__context__
    if isinstance(error, RetriesExceededError) and error.last_exception is not None:
        return error.last_exception
    return error


class ObjectStoreConfig(BaseModel):
    """Where objects go. Holds no secrets."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    bucket: str = Field(default="hvdflow", min_length=3)
    prefix: str = "hvdflow"
    endpoint_url: str | None = None
    region: str = "us-east-1"
    attempts: int = Field(default=DEFAULT_ATTEMPTS, ge=1)
    # How long one attempt waits to connect, and then for each answer.
    connect_timeout_s: float = Field(default=3.0, gt=0)
    read_timeout_s: float = Field(default=60.0, gt=0)

    @field_validator("prefix")
    @classmethod
    def _strip_slashes(cls, value: str) -> str:
        return value.strip("/")

    @classmethod
    def from_env(cls, **overrides) -> ObjectStoreConfig:
        """Bucket, prefix and endpoint from the environment; ``overrides`` win."""
        values = {
            "bucket": os.environ.get(c.HVDFLOW_BUCKET),
            "prefix": os.environ.get(c.HVDFLOW_PREFIX),
            "endpoint_url": s3_endpoint(),
            "region": os.environ.get(c.AWS_DEFAULT_REGION) or os.environ.get(c.AWS_REGION),
        }
        values = {k: v for k, v in values.items() if v}
        values.update(overrides)
        return cls(**values)

    @property
    def endpoint(self) -> str:
        return self.endpoint_url or "AWS S3 (no AWS_ENDPOINT_URL set)"

    def uri(self, key: str) -> str:
        return f"s3://{self.bucket}/{key}"

    def key(self, *parts: str) -> str:
        return "/".join(p.strip("/") for p in (self.prefix, *parts) if p)


def file_suffix(name: str) -> str:
    """The extension to keep when renaming ``name`` by content: Keras reads ``x.weights.h5``
    (its new weights format) differently from ``x.h5``, so the compound suffix must survive."""
    base = os.path.basename(urlparse(name).path or name)
    for compound in (".weights.h5", ".tar.gz"):
        if base.endswith(compound):
            return compound
    return os.path.splitext(base)[1]


def sha256_file(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


class ObjectStore:
    """A bucket, with errors that name the endpoint or the object and say what to do."""

    def __init__(self, config: ObjectStoreConfig | None = None):
        self.config = config or ObjectStoreConfig.from_env()
        self._client = S3Access.from_env(self.config).client(
            10,  # boto3's default pool: one store object serves one thread at a time here
            connect_timeout_s=self.config.connect_timeout_s,
            read_timeout_s=self.config.read_timeout_s,
            attempts=self.config.attempts,
        )

    # --- errors ---------------------------------------------------------------------------
    def _call(self, what: str, uri: str, fn, *args, **kwargs):
        """``fn(*args, **kwargs)``, any failure turned into one ObjectStoreError."""
        try:
            return fn(*args, **kwargs)
        except (ClientError, BotoCoreError, S3UploadFailedError, RetriesExceededError) as e:
            raise self._error(what, uri, e) from None

    def _error(self, what: str, uri: str, error: Exception) -> ObjectStoreError:
        """What went wrong, for the user: the one message for each way a call can fail."""
        error = _underlying(error)
        endpoint = self.config.endpoint
        attempts = self.config.attempts
        where = f"object store at {endpoint}"
        if isinstance(error, ConnectTimeoutError):
            return ObjectStoreUnreachableError(
                f"{where} is unreachable after {attempts} attempts (no connection within "
                f"{self.config.connect_timeout_s:g} s, set by ObjectStoreConfig.connect_timeout_s) "
                f"to {what} {uri}: start it with `hvdflow up`, or set AWS_ENDPOINT_URL to a "
                "running S3-compatible server"
            )
        if isinstance(error, BotoConnectionError):
            return ObjectStoreUnreachableError(
                f"{where} is unreachable after {attempts} attempts ({type(error).__name__}) to "
                f"{what} {uri}: start it with `hvdflow up`, or set AWS_ENDPOINT_URL to a running "
                "S3-compatible server"
            )
        if isinstance(error, ReadTimeoutError):
            return ObjectStoreUnreachableError(
                f"{where} did not answer within {self.config.read_timeout_s:g} s (set by "
                f"ObjectStoreConfig.read_timeout_s) in {attempts} attempts to {what} {uri}: "
                "check that the server AWS_ENDPOINT_URL names is healthy, or set "
                "AWS_ENDPOINT_URL to one that is"
            )
        if isinstance(error, NoCredentialsError):
            return ObjectStoreError(
                f"{where} needs credentials to {what} {uri}, and none were found: set "
                "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (or an AWS profile)"
            )
        if not isinstance(error, ClientError):
            return ObjectStoreError(
                f"{where} failed to {what} {uri} ({type(error).__name__}): check "
                "AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY"
            )
        code = error.response.get("Error", {}).get("Code", "")
        if code in ("404", "NoSuchKey", "NotFound"):
            return ObjectStoreError(
                f"{uri} does not exist at {endpoint}: stage it first, or check "
                "the bucket and prefix (HVDFLOW_BUCKET, HVDFLOW_PREFIX)",
                missing=True,
            )
        if code == "NoSuchBucket":
            return ObjectStoreError(
                f"bucket {self.config.bucket!r} does not exist at {endpoint} "
                f"(needed to {what} {uri}): create it or set HVDFLOW_BUCKET",
                missing=True,
            )
        if code in DENIED_CODES:
            return ObjectStoreError(
                f"{where} refused the credentials to {what} {uri} ({code}): set "
                "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY to a key pair it accepts"
            )
        return ObjectStoreError(f"{where} could not {what} {uri}: {code or type(error).__name__}")

    # --- operations -----------------------------------------------------------------------
    def ensure_bucket(self) -> None:
        uri = f"s3://{self.config.bucket}"
        try:
            self._call("check", uri, self._client.head_bucket, Bucket=self.config.bucket)
        except ObjectStoreError as e:
            if not e.missing:
                raise
            logger.info("creating bucket %s at %s", self.config.bucket, self.config.endpoint)
            self._call("create", uri, self._client.create_bucket, Bucket=self.config.bucket)

    def head(self, uri: str) -> dict | None:
        """The object's size, ETag (unquoted) and metadata, or None when it does not exist."""
        bucket, key = parse_uri(uri)
        try:
            response = self._call("read", uri, self._client.head_object, Bucket=bucket, Key=key)
        except ObjectStoreError as e:
            if e.missing:
                return None
            raise
        return {
            "size": response["ContentLength"],
            "etag": str(response.get("ETag", "")).strip('"'),
            "metadata": response.get("Metadata", {}),
        }

    def upload_file(
        self,
        path: str,
        uri: str,
        metadata: dict[str, str] | None = None,
        progress: Callable[[int], object] | None = None,
    ) -> None:
        """Upload the file at ``path`` to ``uri``. ``progress(n)``: the bytes sent since its last
        call, from boto3's transfer threads."""
        bucket, key = parse_uri(uri)
        extra = {"Metadata": {k: str(v) for k, v in (metadata or {}).items()}}
        self._call(
            "upload",
            uri,
            self._client.upload_file,
            path,
            bucket,
            key,
            ExtraArgs=extra,
            Callback=progress,
        )

    def put_bytes(self, data: bytes, uri: str, content_type: str = "application/json") -> None:
        bucket, key = parse_uri(uri)
        self._call(
            "write",
            uri,
            self._client.put_object,
            Bucket=bucket,
            Key=key,
            Body=data,
            ContentType=content_type,
        )

    def get_bytes(self, uri: str) -> bytes:
        bucket, key = parse_uri(uri)
        response = self._call("read", uri, self._client.get_object, Bucket=bucket, Key=key)
        return response["Body"].read()

    def download_file(self, uri: str, path: str) -> None:
        bucket, key = parse_uri(uri)
        self._call("download", uri, self._client.download_file, bucket, key, path)

    def delete(self, uri: str) -> None:
        """Remove the object at ``uri``; one that does not exist is no error."""
        bucket, key = parse_uri(uri)
        self._call("delete", uri, self._client.delete_object, Bucket=bucket, Key=key)

    def list_keys(self, prefix: str) -> list[str]:
        uri = self.config.uri(prefix)
        paginator = self._client.get_paginator("list_objects_v2")
        keys: list[str] = []
        pages = paginator.paginate(Bucket=self.config.bucket, Prefix=prefix)
        for page in self._call("list", uri, list, pages):
            keys.extend(obj["Key"] for obj in page.get("Contents", []))
        return keys
