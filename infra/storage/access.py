"""How to reach the object store: the endpoint and credentials as one picklable value, and the
one factory for boto3 clients.

Executors and ranks talk to object storage with boto3: one client per process or partition,
built from an ``S3Access`` that travels in the Spark closure. It holds the endpoint and region,
and the driver's standard AWS variables when the driver has them (executors started before the
driver set them would not see them otherwise: the reason HorovodRunner forwards the same
variables to its ranks); unset values fall back to the executor's own credential chain.
Credentials are left out of its repr, so they never reach a log.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from hvdflow.infra import constants as c


def s3_endpoint() -> str | None:
    """The S3 endpoint the AWS tools would use: ``AWS_ENDPOINT_URL_S3``, else ``AWS_ENDPOINT_URL``;
    None means AWS S3 itself."""
    return os.environ.get(c.AWS_ENDPOINT_URL_S3) or os.environ.get(c.AWS_ENDPOINT_URL) or None


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
        """The endpoint and region of ``store`` (an ObjectStore or its ObjectStoreConfig) or of
        the AWS variables, and the credentials this process has in its environment."""
        env = os.environ
        if store is not None:
            config = getattr(store, "config", store)
            endpoint, region = config.endpoint_url, config.region
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

    def client(
        self,
        connections: int = 16,
        *,
        connect_timeout_s: float = 5.0,
        read_timeout_s: float = 60.0,
        attempts: int = 4,
    ):
        """A new boto3 S3 client: the one factory every part of hvdflow builds clients with
        (thread-safe; build one per process or partition, never pickle one). A session of its
        own: boto3's default session keeps the first keys it found for the rest of the process,
        and the keys in the environment now are the ones that count."""
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
                connect_timeout=connect_timeout_s,
                read_timeout=read_timeout_s,
                retries={"max_attempts": attempts, "mode": "standard"},
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
