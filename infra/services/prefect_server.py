"""The embedded Prefect server (API and UI): ``prefect server start`` with sqlite in its home.

Bound to 127.0.0.1, analytics off. Any ``PREFECT_API_URL`` the user sets is used instead (see
``infra.services.local``).
"""

from __future__ import annotations

import os
import sys
import urllib.request
from pathlib import Path

from infra.services._service import Service


class PrefectServer(Service):
    """``prefect server start`` on 127.0.0.1 with ``PREFECT_HOME`` = ``home``."""

    name = "Prefect server"
    log_name = "server.log"
    # The first start creates and migrates its database.
    START_TIMEOUT_S = 120.0
    STOP_TIMEOUT_S = 10.0
    POLL_INTERVAL_S = 0.5

    @property
    def api_url(self) -> str:
        """What clients set as ``PREFECT_API_URL``; the UI is at ``url``."""
        return f"{self.url}/api"

    def _command(self) -> list[str]:
        prefect = str(Path(sys.executable).parent / "prefect")
        return [prefect, "server", "start", "--host", "127.0.0.1", "--port", str(self.port)]

    def _env(self) -> dict[str, str]:
        env = {
            **os.environ,
            "PREFECT_HOME": str(self.home),
            "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
            "PREFECT_UI_API_URL": self.api_url,  # where the browser's UI calls the API
        }
        env.pop("PREFECT_API_URL", None)  # it is the server, not a client of another one
        return env

    def _ready(self) -> bool:
        with urllib.request.urlopen(f"{self.api_url}/health", timeout=2) as response:
            return response.status == 200
