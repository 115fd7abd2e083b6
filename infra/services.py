"""The embedded services behind ``hvdflow up`` and ``hvdflow down``.

SeaweedFS (S3), the MLflow tracking server and the Prefect server (UI and API), on 127.0.0.1,
with their data and a state file in ``$HVDFLOW_HOME`` (default ``~/.hvdflow``). They keep
running after ``hvdflow up`` exits, so the UIs stay there to look at; ``hvdflow down`` stops
them. What the user already configured (``AWS_ENDPOINT_URL``, ``MLFLOW_TRACKING_URI``,
``PREFECT_API_URL``) is used instead of starting the embedded one.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import sys
import time
import urllib.request
from pathlib import Path

from infra import constants as c
from infra._env import temporary_env
from infra._service import start_process
from infra.seaweed import SeaweedServer

logger = logging.getLogger(__name__)

STATE_FILE = "services.json"
# Conventional ports, used when free: S3 (SeaweedFS), MLflow, Prefect.
PREFERRED_PORTS = {"s3": 8333, "mlflow": 5000, "prefect": 4200}
START_TIMEOUT_S = 120.0
STOP_TIMEOUT_S = 10.0
ARTIFACT_BUCKET = "hvdflow"


def hvdflow_home() -> Path:
    return Path(os.environ.get(c.HVDFLOW_HOME) or Path.home() / ".hvdflow")


def _port(name: str) -> int:
    from infra.seaweed import free_port

    preferred = PREFERRED_PORTS[name]
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", preferred))
            return preferred
        except OSError:
            return free_port()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False


def _wait_http(url: str, timeout_s: float, what: str, log: Path) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=2):
                return
        except OSError:
            time.sleep(0.5)
    raise RuntimeError(f"{what} did not answer at {url} within {timeout_s:g} s; see {log}")


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
        return {k: v for k, v in state.items() if _alive(v["pid"])}

    def _save(self, state: dict) -> None:
        self.home.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.state_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump(state, f, indent=2)

    def up(self, prefect: bool = True) -> dict[str, str]:
        """Start what is not running yet; return the environment that points at them."""
        state = self.state()
        if "s3" not in state and not os.environ.get(c.AWS_ENDPOINT_URL):
            server = SeaweedServer(self.home / "seaweed", s3_port=_port("s3")).start(
                START_TIMEOUT_S
            )
            state["s3"] = {"pid": server.process.pid, "url": server.endpoint_url}
            self._save(state)
        env = self._store_env(state)
        if "mlflow" not in state and not os.environ.get("MLFLOW_TRACKING_URI"):
            state["mlflow"] = self._start_mlflow(env)
            self._save(state)
        if prefect and "prefect" not in state and not os.environ.get("PREFECT_API_URL"):
            state["prefect"] = self._start_prefect()
            self._save(state)
        return self.env(state)

    def _store_env(self, state: dict) -> dict[str, str]:
        if "s3" not in state:
            return {}
        server = SeaweedServer(
            self.home / "seaweed", s3_port=int(state["s3"]["url"].rsplit(":", 1)[1])
        )
        return server.env()

    def _start_mlflow(self, store_env: dict[str, str]) -> dict:
        from infra.mlflow_server import MlflowServer
        from infra.object_store import ObjectStore, ObjectStoreConfig

        with temporary_env(store_env):
            ObjectStore(ObjectStoreConfig.from_env(bucket=ARTIFACT_BUCKET)).ensure_bucket()
        server = MlflowServer(
            self.home / "mlflow",
            f"s3://{ARTIFACT_BUCKET}/mlflow-artifacts",
            store_env,
            port=_port("mlflow"),
        ).start(START_TIMEOUT_S)
        return {"pid": server.process.pid, "url": server.tracking_uri}

    def _start_prefect(self) -> dict:
        port = _port("prefect")
        env = {
            **os.environ,
            "PREFECT_HOME": str(self.home / "prefect"),
            "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
            "PREFECT_UI_API_URL": f"http://127.0.0.1:{port}/api",
        }
        env.pop("PREFECT_API_URL", None)
        log = self.home / "prefect" / "server.log"
        prefect = str(Path(sys.executable).parent / "prefect")
        process = start_process(
            [prefect, "server", "start", "--host", "127.0.0.1", "--port", str(port)], log, env
        )
        url = f"http://127.0.0.1:{port}/api"
        try:
            _wait_http(f"{url}/health", START_TIMEOUT_S, "the Prefect server", log)
        except RuntimeError:
            _stop_pid(process.pid)
            raise
        return {"pid": process.pid, "url": url}

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
        for name in ("prefect", "mlflow", "s3"):  # dependants first
            if name in state:
                _stop_pid(state[name]["pid"])
        if self.state_path.exists():
            self.state_path.unlink()
        return [name for name in ("prefect", "mlflow", "s3") if name in state]


def _stop_pid(pid: int) -> None:
    """SIGTERM the service's process group, SIGKILL it after STOP_TIMEOUT_S."""
    try:
        os.killpg(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + STOP_TIMEOUT_S
    while time.monotonic() < deadline:
        try:
            os.waitpid(pid, os.WNOHANG)  # reap it if it is our child
        except ChildProcessError:
            pass
        if not _alive(pid):
            return
        time.sleep(0.2)
    try:
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
