"""The embedded default tracking server: ``mlflow server`` with sqlite and artifacts in S3.

Bound to 127.0.0.1, runs, registry and the artifact proxy in one process: clients log
artifacts through the server (``mlflow-artifacts:/``), so only the server needs the object
store's credentials. Any ``MLFLOW_TRACKING_URI`` the user sets is used instead (see
``infra.tracking``).
"""

from __future__ import annotations

import logging
import os
import sys
import urllib.request
from pathlib import Path

from infra._service import start_process, stop_process, wait_until_ready
from infra.seaweed import free_port

logger = logging.getLogger(__name__)

START_TIMEOUT_S = 90.0
STOP_TIMEOUT_S = 10.0


class MlflowServer:
    """``mlflow server`` on 127.0.0.1; a context manager, or start()/stop()."""

    def __init__(
        self,
        home: str | Path,
        artifacts_destination: str,
        store_env: dict[str, str],
        port: int | None = None,
    ):
        self.home = Path(home)
        self.artifacts_destination = artifacts_destination
        self.port = port or free_port()
        self._store_env = dict(store_env)
        self.process = None

    @property
    def tracking_uri(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _command(self) -> list[str]:
        database = self.home / "mlflow.db"
        return [
            str(Path(sys.executable).parent / "mlflow"),
            "server",
            "--backend-store-uri",
            f"sqlite:///{database}",
            "--artifacts-destination",
            self.artifacts_destination,
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--workers",
            "1",
        ]

    def start(self, timeout_s: float = START_TIMEOUT_S) -> MlflowServer:
        self.home.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, **self._store_env}
        env.pop("MLFLOW_TRACKING_URI", None)
        self.process = start_process(self._command(), self.home / "mlflow-server.log", env)
        logger.info("starting MLflow tracking server at %s", self.tracking_uri)

        def healthy() -> bool:
            with urllib.request.urlopen(f"{self.tracking_uri}/health", timeout=2) as r:
                return r.status == 200

        try:
            wait_until_ready(
                self.process,
                healthy,
                what=f"MLflow server at {self.tracking_uri}",
                timeout_s=timeout_s,
                setting="infra.mlflow_server.START_TIMEOUT_S",
                log_path=self.home / "mlflow-server.log",
                interval_s=0.5,
            )
        except RuntimeError:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        stop_process(self.process, STOP_TIMEOUT_S)

    def __enter__(self) -> MlflowServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
