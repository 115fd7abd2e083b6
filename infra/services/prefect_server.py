"""The embedded Prefect server (API and UI): ``prefect server start`` with sqlite in its home.

Analytics off. On 127.0.0.1 its API is open unless ``auth=True``; on any other address it always
requires its auth string (``admin:<generated>``, kept in ``credentials.json``, 0600) on every call
but the health check. Clients send it through ``PREFECT_API_AUTH_STRING``; the UI asks for it.
"""

from __future__ import annotations

import os
import sys
import urllib.request
from pathlib import Path

from hvdflow.infra import constants as c
from hvdflow.infra.services._database_template import DATABASE_NAME, seed_prefect_database
from hvdflow.infra.services._process import LOOPBACK, is_loopback
from hvdflow.infra.services._secrets import load_or_create_json, new_secret
from hvdflow.infra.services._service import Service

# The user part of the auth string: Prefect checks the whole "user:password" string.
AUTH_USER = "admin"


LEASE_STORAGE_VARIABLE = "PREFECT_SERVER_CONCURRENCY_LEASE_STORAGE"
FILESYSTEM_LEASE_STORAGE = "prefect.server.concurrency.lease_storage.filesystem"


class PrefectServer(Service):
    """``prefect server start`` on ``host`` (127.0.0.1 by default) with ``PREFECT_HOME`` =
    ``home``. Requires its auth string when ``auth`` is set or ``host`` is beyond loopback."""

    name = "Prefect server"
    log_name = "server.log"
    SECRET_VARIABLES = {c.PREFECT_API_AUTH_STRING: "auth_string"}
    # The first start creates and migrates its database.
    START_TIMEOUT_S = 120.0
    STOP_TIMEOUT_S = 10.0
    POLL_INTERVAL_S = 0.5

    def __init__(
        self,
        home: str | Path,
        port: int | None = None,
        *,
        host: str = LOOPBACK,
        auth: bool = False,
    ):
        super().__init__(home, port, host=host)
        # Beyond loopback, anyone who reaches the port could run, change or delete deployments.
        self.auth = auth or not is_loopback(host)
        self._secrets = (
            load_or_create_json(
                self.credentials_path,
                lambda: {"auth_string": f"{AUTH_USER}:{new_secret()}"},
            )
            if self.auth
            else {}
        )

    @property
    def api_url(self) -> str:
        """What clients set as ``PREFECT_API_URL``; the UI is at ``url``."""
        return f"{self.url}/api"

    @property
    def database_path(self) -> Path:
        """Its SQLite database (unless ``PREFECT_SERVER_DATABASE_CONNECTION_URL`` names another)."""
        return self.home / DATABASE_NAME

    def env(self) -> dict[str, str]:
        """PREFECT_API_URL, and the auth string when the server requires one."""
        env = {c.PREFECT_API_URL: self.api_url}
        if self.auth:
            env[c.PREFECT_API_AUTH_STRING] = self._secrets["auth_string"]
        return env

    def _prepare(self) -> None:
        super()._prepare()
        seed_prefect_database(self.home, self._env())

    def _command(self) -> list[str]:
        prefect = str(Path(sys.executable).parent / "prefect")
        return [prefect, "server", "start", "--host", self.host, "--port", str(self.port)]

    def _env(self) -> dict[str, str]:
        env = {
            **os.environ,
            "PREFECT_HOME": str(self.home),
            "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
            "PREFECT_UI_API_URL": self.api_url,  # where the browser's UI calls the API
        }
        # Leases of concurrency slots (spark-slots, the deployments' limits) on disk, in
        # PREFECT_HOME: Prefect's default keeps them in memory, and a restart under a flow
        # that held slots lost the lease, so its release found none and the slots stayed taken
        # for good. Unless the user chose a storage of their own.
        env.setdefault(LEASE_STORAGE_VARIABLE, FILESYSTEM_LEASE_STORAGE)
        # It is the server, not a client of another one; and it requires exactly the auth
        # string it was given, or none.
        for name in (
            c.PREFECT_API_URL,
            c.PREFECT_API_AUTH_STRING,
            c.PREFECT_SERVER_API_AUTH_STRING,
        ):
            env.pop(name, None)
        if self.auth:
            env[c.PREFECT_SERVER_API_AUTH_STRING] = self._secrets["auth_string"]
        return env

    def _ready(self) -> bool:
        # The health check answers without the auth string, with or without auth.
        with urllib.request.urlopen(f"{self.api_url}/health", timeout=2) as response:
            return response.status == 200
