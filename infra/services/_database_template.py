"""A new home's Prefect and MLflow databases, copied from ones migrated once per version.

Migrating a new SQLite database is much of a first server start (Prefect's: 12 CPU-s against 3.5
on a migrated one). The migrated, empty database is the same for one version of the server, so it
is made once in hvdflow's cache and copied into each new home. A user who points Prefect at a
database of their own (``PREFECT_SERVER_DATABASE_CONNECTION_URL``) gets no copy.
"""

from __future__ import annotations

import importlib.metadata
import logging
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from hvdflow.infra.storage.locks import cache_root, machine_lock

logger = logging.getLogger(__name__)

# Prefect's own name for its SQLite database in PREFECT_HOME.
DATABASE_NAME = "prefect.db"
# The variables that point Prefect at another database.
CONNECTION_URL_VARIABLES = (
    "PREFECT_SERVER_DATABASE_CONNECTION_URL",
    "PREFECT_API_DATABASE_CONNECTION_URL",
)
# Bounds the one migration that makes a template (7 s for Prefect's on the 2-core machine).
MIGRATE_TIMEOUT_S = 300.0


def seed_prefect_database(home: Path, env: dict[str, str]) -> bool:
    """Copy Prefect's migrated template into ``home`` when it has no database yet; True if
    copied. ``env`` is the server's environment."""
    if any(env.get(name) for name in CONNECTION_URL_VARIABLES):
        return False
    return _seed(home / DATABASE_NAME, "Prefect", lambda: prefect_database_template(env))


def seed_mlflow_database(database: Path, env: dict[str, str]) -> bool:
    """Copy MLflow's migrated template to ``database`` (the server's SQLite file) when it does
    not exist yet; True if copied. ``env`` is the server's environment."""
    return _seed(database, "MLflow", lambda: mlflow_database_template(env))


def prefect_database_template(env: dict[str, str]) -> Path:
    """The cache's migrated, empty Prefect database for the installed Prefect."""

    def migrate(scratch: Path) -> Path:
        prefect = str(Path(sys.executable).parent / "prefect")
        _run([prefect, "server", "database", "upgrade", "-y"], {**env, "PREFECT_HOME": scratch})
        return scratch / DATABASE_NAME

    return _template("prefect", migrate)


def mlflow_database_template(env: dict[str, str]) -> Path:
    """The cache's migrated, empty MLflow tracking database for the installed MLflow."""

    def migrate(scratch: Path) -> Path:
        database = scratch / "mlflow.db"
        mlflow = str(Path(sys.executable).parent / "mlflow")
        _run([mlflow, "db", "upgrade", f"sqlite:///{database}"], env)
        return database

    return _template("mlflow", migrate)


def _seed(target: Path, server: str, template) -> bool:
    """Best effort: when the template cannot be made, the server migrates a new database
    itself, as it would without this."""
    if target.exists():
        return False
    try:
        made = template()
        partial = target.with_name(target.name + ".copying")
        shutil.copyfile(made, partial)
        os.replace(partial, target)
    except (OSError, subprocess.SubprocessError, TimeoutError) as e:
        said = getattr(e, "stderr", None) or b""
        logger.warning(
            "%s will create its database itself (no migrated copy: %s %s)",
            server,
            e,
            said.decode(errors="replace")[-2000:],
        )
        return False
    return True


def _template(distribution: str, migrate) -> Path:
    """``cache/<distribution>/empty-<version>.db``; made by ``migrate(scratch folder)`` (which
    returns the database it made there) when missing, once per machine."""
    version = importlib.metadata.version(distribution)
    template = cache_root() / distribution / f"empty-{version}.db"
    if template.exists():
        return template
    what = f"the {distribution} database template"
    with machine_lock(f"{template}.lock", MIGRATE_TIMEOUT_S, what):
        if template.exists():  # another process made it while this one waited
            return template
        template.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=template.parent) as scratch:
            os.replace(migrate(Path(scratch)), template)
        logger.info("made the %s %s database template %s", distribution, version, template)
    return template


def _run(command: list[str], env: dict) -> None:
    subprocess.run(
        command,
        env={k: str(v) for k, v in env.items()},
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        timeout=MIGRATE_TIMEOUT_S,
        check=True,
    )
