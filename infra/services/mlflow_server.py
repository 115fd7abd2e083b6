"""The embedded default tracking server: ``mlflow server`` with sqlite and artifacts in S3.

Runs, registry and the artifact proxy in one process: clients log artifacts through the server
(``mlflow-artifacts:/``), so only the server needs the object store's credentials.

On 127.0.0.1 it needs no login unless ``auth=True``; on any other address it always requires one
(MLflow's basic-auth app, one admin whose password and CSRF key are generated at the first such
start into ``credentials.json``, 0600). Clients log in through MLFLOW_TRACKING_USERNAME/PASSWORD.
"""

from __future__ import annotations

import logging
import os
import shutil
import sqlite3
import sys
import time
import urllib.request
from pathlib import Path

from hvdflow.infra import constants as c
from hvdflow.infra.services._database_template import seed_mlflow_database
from hvdflow.infra.services._process import LOOPBACK, is_loopback, url_host
from hvdflow.infra.services._secrets import load_or_create_json, new_secret, write_private
from hvdflow.infra.services._service import Service

logger = logging.getLogger(__name__)

ADMIN_USERNAME = "admin"
# Every user but the admin on what they did not create: a user added later never sees every
# run by accident (MLflow's own default is READ).
DEFAULT_PERMISSION = "NO_PERMISSIONS"
# Who checks each request: MLflow's basic auth against its user database.
AUTHORIZATION_FUNCTION = "mlflow.server.auth:authenticate_request_basic_auth"
# How long a login that passed is remembered: checking one hashes the password (about a second
# on a busy 2-core machine). With one worker, a password changed through the API acts at once.
AUTH_CACHE_TTL_S = 60


class MlflowServer(Service):
    """``mlflow server`` on ``host`` (127.0.0.1 by default); a context manager, or
    start()/stop(). Requires a login when ``auth`` is set or ``host`` is beyond loopback."""

    name = "MLflow server"
    log_name = "mlflow-server.log"
    SECRET_VARIABLES = {c.MLFLOW_TRACKING_PASSWORD: "password"}
    START_TIMEOUT_S = 90.0
    STOP_TIMEOUT_S = 10.0
    POLL_INTERVAL_S = 0.5

    def __init__(
        self,
        home: str | Path,
        artifacts_destination: str,
        store_env: dict[str, str],
        port: int | None = None,
        *,
        host: str = LOOPBACK,
        auth: bool = False,
    ):
        super().__init__(home, port, host=host)
        self.artifacts_destination = artifacts_destination
        self._store_env = dict(store_env)
        # Beyond loopback, anyone who reaches the port could read and change every run.
        self.auth = auth or not is_loopback(host)
        self._secrets = (
            load_or_create_json(
                self.credentials_path,
                lambda: {
                    "username": ADMIN_USERNAME,
                    "password": new_secret(),
                    "flask_secret_key": new_secret(),
                },
            )
            if self.auth
            else {}
        )

    @property
    def tracking_uri(self) -> str:
        return self.url

    @property
    def auth_config_path(self) -> Path:
        return self.home / "basic_auth.ini"

    def env(self) -> dict[str, str]:
        """MLFLOW_TRACKING_URI, and the admin's login when the server requires one."""
        env = {c.MLFLOW_TRACKING_URI: self.tracking_uri}
        if self.auth:
            env[c.MLFLOW_TRACKING_USERNAME] = self._secrets["username"]
            env[c.MLFLOW_TRACKING_PASSWORD] = self._secrets["password"]
        return env

    @property
    def database_path(self) -> Path:
        return self.home / "mlflow.db"

    def _prepare(self) -> None:
        super()._prepare()
        seed_mlflow_database(self.database_path, self._env())  # a new home: no migration
        recover_interrupted_migration(self.database_path)
        if self.auth:
            write_private(self.auth_config_path, self._auth_config())

    def _auth_config(self) -> str:
        """The basic-auth app's ini file (its admin password is used only to create the users)."""
        database = f"sqlite:///{self.home / 'basic_auth.db'}".replace("%", "%%")
        return (
            "[mlflow]\n"
            f"default_permission = {DEFAULT_PERMISSION}\n"
            f"database_uri = {database}\n"
            f"admin_username = {self._secrets['username']}\n"
            f"admin_password = {self._secrets['password']}\n"
            f"authorization_function = {AUTHORIZATION_FUNCTION}\n"
            f"auth_cache_ttl_seconds = {AUTH_CACHE_TTL_S}\n"
        )

    def _command(self) -> list[str]:
        command = [
            str(Path(sys.executable).parent / "mlflow"),
            "server",
            "--backend-store-uri",
            f"sqlite:///{self.database_path}",
            "--artifacts-destination",
            self.artifacts_destination,
            "--host",
            self.host,
            "--port",
            str(self.port),
            "--workers",
            "1",
        ]
        if not is_loopback(self.host):
            # MLflow accepts Host headers and browser origins of loopback and private ranges
            # only: name the address clients use, or they (and the UI) are turned away.
            host = url_host(self.host)
            command += [
                "--allowed-hosts",
                f"{host},{host}:{self.port}",
                "--cors-allowed-origins",
                f"http://{host}:{self.port}",
            ]
        if self.auth:
            command += ["--app-name", "basic-auth"]
        return command

    def _env(self) -> dict[str, str]:
        env = {**os.environ, **self._store_env}
        # It is the tracking server, not a client of one; and its ini file alone says who
        # the admin is (MLflow would take these variables over the file).
        for name in (
            c.MLFLOW_TRACKING_URI,
            c.MLFLOW_TRACKING_USERNAME,
            c.MLFLOW_TRACKING_PASSWORD,
            c.MLFLOW_AUTH_ADMIN_USERNAME,
            c.MLFLOW_AUTH_ADMIN_PASSWORD,
            c.MLFLOW_AUTH_CONFIG_PATH,
            c.MLFLOW_FLASK_SERVER_SECRET_KEY,
        ):
            env.pop(name, None)
        # MLflow 3's job runner (eight processes, for GenAI jobs hvdflow never asks for): off.
        env.setdefault(c.MLFLOW_SERVER_ENABLE_JOB_EXECUTION, "false")
        if self.auth:
            env[c.MLFLOW_AUTH_CONFIG_PATH] = str(self.auth_config_path)
            env[c.MLFLOW_FLASK_SERVER_SECRET_KEY] = self._secrets["flask_secret_key"]
        return env

    def _ready(self) -> bool:
        # /health answers without a login, with or without auth.
        with urllib.request.urlopen(f"{self.url}/health", timeout=2) as response:
            return response.status == 200


# Alembic alters a SQLite table through a copy under this prefix; a migration stopped half way
# leaves the copy, and every later start fails with "table _alembic_tmp_<name> already exists".
ALEMBIC_TMP_PREFIX = "_alembic_tmp_"


def recover_interrupted_migration(database: Path) -> list[str]:
    """Drop what an interrupted schema migration left in the tracking database, so that the
    server's start runs it again; return the tables dropped.

    A copy whose original still exists is dropped (the file copied aside first); a copy without
    its original holds the only rows, and is left for a person, with the steps.
    """
    if not database.exists():
        return []
    with sqlite3.connect(database) as db:
        tables = {row[0] for row in db.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    leftovers = sorted(t for t in tables if t.startswith(ALEMBIC_TMP_PREFIX))
    if not leftovers:
        return []
    orphans = [t for t in leftovers if t.removeprefix(ALEMBIC_TMP_PREFIX) not in tables]
    if orphans:
        raise RuntimeError(
            f"the MLflow database {database} holds {', '.join(orphans)} from an interrupted "
            f"schema migration, without the table{'s' if len(orphans) > 1 else ''} it replaces: "
            "its rows are there only. Stop every MLflow server on it, copy the file aside, then "
            f"rename each table to its name without {ALEMBIC_TMP_PREFIX!r} "
            f"(sqlite3 {database} 'ALTER TABLE {orphans[0]} RENAME TO "
            f"{orphans[0].removeprefix(ALEMBIC_TMP_PREFIX)}') and start again"
        )
    backup = database.with_name(f"{database.name}.before-recovery-{time.strftime('%Y%m%d-%H%M%S')}")
    shutil.copy2(database, backup)
    with sqlite3.connect(database) as db:
        for table in leftovers:
            db.execute(f'DROP TABLE "{table}"')
    logger.warning(
        "the MLflow database %s held %s from an interrupted schema migration: dropped (the "
        "original tables are intact; a copy of the file is at %s); the server's start runs the "
        "migration again",
        database,
        ", ".join(leftovers),
        backup,
    )
    return leftovers
