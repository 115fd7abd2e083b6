"""The embedded services behind ``hvdflow up`` and ``hvdflow down``.

SeaweedFS (S3), the MLflow tracking server and the Prefect server (UI and API), on 127.0.0.1,
with their data and a state file in ``$HVDFLOW_HOME`` (default ``~/.hvdflow``). They keep
running after ``hvdflow up`` exits, so the UIs stay there to look at; ``hvdflow down`` stops
them. What the user already configured (``AWS_ENDPOINT_URL``, ``MLFLOW_TRACKING_URI``,
``PREFECT_API_URL``) is used instead of starting the embedded one.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from infra import constants as c
from infra._env import temporary_env
from infra.services._process import free_port, is_running, port_is_free, stop_process_group
from infra.services._service import Service
from infra.services.mlflow_server import MlflowServer
from infra.services.prefect_server import PrefectServer
from infra.services.seaweed import SeaweedServer

STATE_FILE = "services.json"
# Conventional ports, used when free: S3 (SeaweedFS), MLflow, Prefect.
PREFERRED_PORTS = {"s3": 8333, "mlflow": 5000, "prefect": 4200}
# How long `hvdflow up` waits for each service; longer than their own defaults, since a first
# start also creates their databases.
START_TIMEOUT_S = 120.0
ARTIFACT_BUCKET = "hvdflow"
# Each service's class, for its stop timeout; stopped in this order, dependants first.
SERVICES: dict[str, type[Service]] = {
    "prefect": PrefectServer,
    "mlflow": MlflowServer,
    "s3": SeaweedServer,
}


def hvdflow_home() -> Path:
    return Path(os.environ.get(c.HVDFLOW_HOME) or Path.home() / ".hvdflow")


def _port(name: str) -> int:
    preferred = PREFERRED_PORTS[name]
    return preferred if port_is_free(preferred) else free_port()


class LocalServices:
    """Start, find and stop the embedded services of one HVDFLOW_HOME."""

    def __init__(self, home: str | Path | None = None):
        self.home = Path(home) if home else hvdflow_home()
        self.state_path = self.home / STATE_FILE

    def state(self) -> dict:
        """The running services (dead ones dropped)."""
        if not self.state_path.exists():
            return {}
        state = json.loads(self.state_path.read_text())
        return {k: v for k, v in state.items() if is_running(v["pid"])}

    def _save(self, state: dict) -> None:
        self.home.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.state_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump(state, f, indent=2)

    def up(self, prefect: bool = True) -> dict[str, str]:
        """Start what is not running yet; return the environment that points at them."""
        state = self.state()
        if "s3" not in state and not os.environ.get(c.AWS_ENDPOINT_URL):
            server = SeaweedServer(self.home / "seaweed", port=_port("s3"))
            self._start(server)
            state["s3"] = {"pid": server.pid, "url": server.endpoint_url}
            self._save(state)
        if "mlflow" not in state and not os.environ.get("MLFLOW_TRACKING_URI"):
            server = self._mlflow_server(self._store_env(state))
            self._start(server)
            state["mlflow"] = {"pid": server.pid, "url": server.tracking_uri}
            self._save(state)
        if prefect and "prefect" not in state and not os.environ.get("PREFECT_API_URL"):
            server = PrefectServer(self.home / "prefect", port=_port("prefect"))
            self._start(server)
            state["prefect"] = {"pid": server.pid, "url": server.api_url}
            self._save(state)
        return self.env(state)

    def _start(self, server: Service) -> None:
        server.start(START_TIMEOUT_S, setting=f"{__name__}.START_TIMEOUT_S")

    def _store_env(self, state: dict) -> dict[str, str]:
        if "s3" not in state:
            return {}
        port = int(state["s3"]["url"].rsplit(":", 1)[1])
        return SeaweedServer(self.home / "seaweed", port=port).env()

    def _mlflow_server(self, store_env: dict[str, str]) -> MlflowServer:
        """The tracking server, its artifact bucket created in the object store."""
        from infra.storage.object_store import ObjectStore, ObjectStoreConfig

        with temporary_env(store_env):
            ObjectStore(ObjectStoreConfig.from_env(bucket=ARTIFACT_BUCKET)).ensure_bucket()
        return MlflowServer(
            self.home / "mlflow",
            f"s3://{ARTIFACT_BUCKET}/mlflow-artifacts",
            store_env,
            port=_port("mlflow"),
        )

    def env(self, state: dict | None = None) -> dict[str, str]:
        """Variables that point boto3, MLflow and Prefect at the running embedded services."""
        state = self.state() if state is None else state
        env = self._store_env(state)
        if "mlflow" in state:
            env["MLFLOW_TRACKING_URI"] = state["mlflow"]["url"]
        if "prefect" in state:
            env["PREFECT_API_URL"] = state["prefect"]["url"]
        return env

    def urls(self) -> dict[str, str]:
        state = self.state()
        urls = {name: info["url"] for name, info in state.items()}
        if "prefect" in urls:
            urls["prefect_ui"] = urls["prefect"].removesuffix("/api")
        return urls

    def down(self) -> list[str]:
        """Stop every embedded service of this home; return the names stopped."""
        state = self.state()
        stopped = [name for name in SERVICES if name in state]
        for name in stopped:
            stop_process_group(state[name]["pid"], SERVICES[name].STOP_TIMEOUT_S)
        if self.state_path.exists():
            self.state_path.unlink()
        return stopped
