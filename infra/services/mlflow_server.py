"""The embedded default tracking server: ``mlflow server`` with sqlite and artifacts in S3.

Bound to 127.0.0.1, runs, registry and the artifact proxy in one process: clients log
artifacts through the server (``mlflow-artifacts:/``), so only the server needs the object
store's credentials. Any ``MLFLOW_TRACKING_URI`` the user sets is used instead (see
``infra.tracking``).
"""

from __future__ import annotations

import os
import sys
import urllib.request
from pathlib import Path

from infra.services._service import Service


class MlflowServer(Service):
    """``mlflow server`` on 127.0.0.1; a context manager, or start()/stop()."""

    name = "MLflow server"
    log_name = "mlflow-server.log"
    START_TIMEOUT_S = 90.0
    STOP_TIMEOUT_S = 10.0
    POLL_INTERVAL_S = 0.5

    def __init__(
        self,
        home: str | Path,
        artifacts_destination: str,
        store_env: dict[str, str],
        port: int | None = None,
    ):
        super().__init__(home, port)
        self.artifacts_destination = artifacts_destination
        self._store_env = dict(store_env)

    @property
    def tracking_uri(self) -> str:
        return self.url

    def _command(self) -> list[str]:
        return [
            str(Path(sys.executable).parent / "mlflow"),
            "server",
            "--backend-store-uri",
            f"sqlite:///{self.home / 'mlflow.db'}",
            "--artifacts-destination",
            self.artifacts_destination,
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--workers",
            "1",
        ]

    def _env(self) -> dict[str, str]:
        env = {**os.environ, **self._store_env}
        env.pop("MLFLOW_TRACKING_URI", None)  # it is the tracking server, not a client of one
        return env

    def _ready(self) -> bool:
        with urllib.request.urlopen(f"{self.url}/health", timeout=2) as response:
            return response.status == 200
