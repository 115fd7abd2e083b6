"""The embedded services behind ``hvdflow up`` and ``hvdflow down``.

SeaweedFS (S3), the MLflow tracking server and the Prefect server on one bind address (default
127.0.0.1), with their data and a state file in ``$HVDFLOW_HOME`` (default ``~/.hvdflow``). They
outlive ``hvdflow up``; ``hvdflow down`` stops them. A service the user already configured
(``AWS_ENDPOINT_URL``, ``MLFLOW_TRACKING_URI``, ``PREFECT_API_URL``) is not started.

Credentials: the object store always checks its keys; beyond loopback MLflow requires a login and
Prefect its auth string too. Secrets are generated at first start into each service's
``credentials.json`` (0600); the state file never holds one. ``env()`` hands clients the URLs and
credentials; ``secret_sources()`` says where each secret is kept, to show instead of it.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from hvdflow.infra import constants as c
from hvdflow.infra._env import temporary_env
from hvdflow.infra.home import hvdflow_home
from hvdflow.infra.services._process import (
    LOOPBACK,
    check_bind_address,
    free_port,
    is_running,
    port_is_free,
    stop_process_group,
)
from hvdflow.infra.services._service import Service
from hvdflow.infra.services.mlflow_server import MlflowServer
from hvdflow.infra.services.prefect_server import PrefectServer
from hvdflow.infra.services.seaweed import SeaweedServer, remove_unix_sockets
from hvdflow.infra.storage.locks import machine_lock

STATE_FILE = "services.json"
# Held while services of one home start or stop: two MLflow servers started together on one
# database would collide in its schema migrations.
LOCK_FILE = "services.lock"
# Conventional ports, used when free: S3 (SeaweedFS), MLflow, Prefect.
PREFERRED_PORTS = {"s3": 8333, "mlflow": 5000, "prefect": 4200}
# How long a service that died waits for its old port before it comes back on another.
PREVIOUS_PORT_WAIT_S = 10.0
# How long `hvdflow up` waits for each service; a first start also creates their databases.
START_TIMEOUT_S = 120.0
ARTIFACT_BUCKET = "hvdflow"
# Each service's class, for its stop timeout; stopped in this order, dependants first.
SERVICES: dict[str, type[Service]] = {
    "prefect": PrefectServer,
    "mlflow": MlflowServer,
    "s3": SeaweedServer,
}


def _port(name: str, host: str, previous: dict | None = None, preferred: int | None = None) -> int:
    """The port to start ``name`` on, each only when free: the one it had before on ``host``
    (its clients still hold its URL; it gets PREVIOUS_PORT_WAIT_S to be released), else
    ``preferred`` (the conventional one by default), else any."""
    before = _previous_port(previous, host)
    deadline = time.monotonic() + PREVIOUS_PORT_WAIT_S
    while before and not _free_for(name, before, host) and time.monotonic() < deadline:
        time.sleep(0.2)
    for port in (before, preferred or PREFERRED_PORTS[name]):
        if port and _free_for(name, port, host):
            return port
    return free_port(host=host)


def _free_for(name: str, port: int, host: str) -> bool:
    """Whether ``name`` could listen on ``port`` of ``host``; on loopback too only for a service
    that listens there as well (another home's 127.0.0.1:4200 must not move our Prefect)."""
    loopback_too = SERVICES[name].ALSO_ON_LOOPBACK and host != LOOPBACK
    return port_is_free(port, host) and (not loopback_too or port_is_free(port))


def _previous_port(entry: dict | None, host: str) -> int | None:
    if not entry or entry.get("host", LOOPBACK) != host:
        return None
    return entry.get("port")


def _entry(server: Service, url: str) -> dict:
    """What the state file keeps of a started server: no secret, only where it is."""
    return {
        "pid": server.pid,
        "url": url,
        "host": server.host,
        "port": server.port,
        "auth": server.auth,
    }


class LocalServices:
    """Start, find and stop the embedded services of one HVDFLOW_HOME."""

    def __init__(self, home: str | Path | None = None, ports: dict[str, int] | None = None):
        """``ports``: the port to prefer for a service by name (``s3``, ``mlflow``,
        ``prefect``) over its conventional one (``PREFERRED_PORTS``), so that several homes on
        one machine do not push each other off their ports when one restarts."""
        self.home = Path(home) if home else hvdflow_home()
        self.state_path = self.home / STATE_FILE
        self.ports = dict(ports or {})

    def state(self) -> dict:
        """The running services (dead ones dropped)."""
        return {k: v for k, v in self._recorded().items() if is_running(v["pid"])}

    def _recorded(self) -> dict:
        """Every service the state file names, dead ones included (where they were)."""
        if not self.state_path.exists():
            return {}
        return json.loads(self.state_path.read_text())

    def _save(self, state: dict) -> None:
        self.home.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.state_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump(state, f, indent=2)

    def up(self, prefect: bool = True, bind: str | None = None) -> dict[str, str]:
        """Start what is not running yet; return the environment that points at them.

        ``bind``: the address all of them listen on and their URLs name (default: that of those
        already running, else 127.0.0.1). Beyond loopback each requires credentials.
        """
        with self._lock("start"):
            return self._up(prefect, bind)

    def _lock(self, doing: str):
        # Long enough for another command to start all three services from a cold home.
        return machine_lock(
            self.home / LOCK_FILE,
            timeout_s=len(SERVICES) * START_TIMEOUT_S + 60,
            what=f"another hvdflow command to {doing} the services of {self.home}",
        )

    def _up(self, prefect: bool, bind: str | None) -> dict[str, str]:
        before = self._recorded()
        state = self.state()
        host = self._bind_address(state, bind, recorded=before)
        if "s3" not in state and not os.environ.get(c.AWS_ENDPOINT_URL):
            server = self._seaweed(host, self._port_for("s3", host, before))
            self._start(server)
            state["s3"] = _entry(server, server.endpoint_url)
            self._save(state)
        if "mlflow" not in state and not os.environ.get(c.MLFLOW_TRACKING_URI):
            store_env = self._store_env(state)
            self._create_artifact_bucket(store_env)
            server = self._mlflow(host, self._port_for("mlflow", host, before), store_env)
            self._start(server)
            state["mlflow"] = _entry(server, server.tracking_uri)
            self._save(state)
        if prefect and "prefect" not in state and not os.environ.get(c.PREFECT_API_URL):
            server = self._prefect(host, self._port_for("prefect", host, before))
            self._start(server)
            state["prefect"] = _entry(server, server.api_url)
            self._save(state)
        return self.env(state)

    def _port_for(self, name: str, host: str, recorded: dict) -> int:
        return _port(name, host, recorded.get(name), self.ports.get(name))

    def _bind_address(self, state: dict, bind: str | None, recorded: dict | None = None) -> str:
        """``bind``, checked against the running services (which cannot move); without it,
        theirs, else that of the ``recorded`` ones that died, else loopback."""
        running = {info.get("host", LOOPBACK) for info in state.values()}
        if bind is None:
            known = running or {info.get("host", LOOPBACK) for info in (recorded or {}).values()}
            return known.pop() if len(known) == 1 else LOOPBACK
        check_bind_address(bind)
        if running and running != {bind}:
            raise RuntimeError(
                f"the services of {self.home} already run on {', '.join(sorted(running))} "
                f"({', '.join(sorted(state))}): stop them with `hvdflow down` before binding "
                f"them to {bind}"
            )
        return bind

    def _start(self, server: Service) -> None:
        server.start(START_TIMEOUT_S, setting=f"{__name__}.START_TIMEOUT_S")

    # --- the servers, built the same way to start them and to find their clients' env ------
    def _seaweed(self, host: str, port: int) -> SeaweedServer:
        return SeaweedServer(self.home / "seaweed", port=port, host=host)

    # MLflow and Prefect turn auth on themselves when ``host`` is beyond loopback.
    def _mlflow(
        self, host: str, port: int, store_env: dict[str, str], auth: bool = False
    ) -> MlflowServer:
        return MlflowServer(
            self.home / "mlflow",
            f"s3://{ARTIFACT_BUCKET}/mlflow-artifacts",
            store_env,
            port=port,
            host=host,
            auth=auth,
        )

    def _prefect(self, host: str, port: int, auth: bool = False) -> PrefectServer:
        return PrefectServer(self.home / "prefect", port=port, host=host, auth=auth)

    def _servers(self, state: dict) -> dict[str, Service]:
        """The running services as server objects (not started by this process)."""
        servers: dict[str, Service] = {}
        for name, info in state.items():
            host = info.get("host", LOOPBACK)
            port = int(info.get("port") or info["url"].rsplit(":", 1)[1].split("/")[0])
            auth = bool(info.get("auth", False))
            if name == "s3":
                servers[name] = self._seaweed(host, port)
            elif name == "mlflow":
                servers[name] = self._mlflow(host, port, store_env={}, auth=auth)
            elif name == "prefect":
                servers[name] = self._prefect(host, port, auth=auth)
        return servers

    def _store_env(self, state: dict) -> dict[str, str]:
        server = self._servers({k: v for k, v in state.items() if k == "s3"}).get("s3")
        return server.env() if server else {}

    def _create_artifact_bucket(self, store_env: dict[str, str]) -> None:
        """The tracking server's artifact bucket, in the object store it will use."""
        from hvdflow.infra.storage.object_store import ObjectStore, ObjectStoreConfig  # noqa: PLC0415 (lazy: it loads boto3)

        with temporary_env(store_env):
            ObjectStore(ObjectStoreConfig.from_env(bucket=ARTIFACT_BUCKET)).ensure_bucket()

    def env(self, state: dict | None = None) -> dict[str, str]:
        """Variables that point boto3, MLflow and Prefect at the running embedded services,
        with the credentials each requires."""
        state = self.state() if state is None else state
        env: dict[str, str] = {}
        for server in self._servers(state).values():
            env.update(server.env())
        return env

    def secret_sources(self, state: dict | None = None) -> dict[str, str]:
        """For each secret of ``env()``, the 0600 file it is kept in, to show instead of it."""
        state = self.state() if state is None else state
        sources: dict[str, str] = {}
        for server in self._servers(state).values():
            sources.update(server.secret_sources())
        return sources

    def urls(self) -> dict[str, str]:
        state = self.state()
        urls = {name: info["url"] for name, info in state.items()}
        if "prefect" in urls:
            urls["prefect_ui"] = urls["prefect"].removesuffix("/api")
        return urls

    def down(self) -> list[str]:
        """Stop every embedded service of this home; return the names stopped."""
        with self._lock("stop"):
            return self._down()

    def _down(self) -> list[str]:
        state = self.state()
        stopped = [name for name in SERVICES if name in state]
        for name in stopped:
            service = SERVICES[name]
            stop_process_group(
                state[name]["pid"], service.STOP_TIMEOUT_S, kill_expected=service.KILL_EXPECTED
            )
        if "s3" in stopped:
            remove_unix_sockets(self.home / "seaweed")
        if self.state_path.exists():
            self.state_path.unlink()
        return stopped
