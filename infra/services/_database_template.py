"""A new Prefect home's database, copied from one migrated once per Prefect version.

Creating and migrating a new SQLite database is most of a first ``prefect server start``: 12.2
CPU-s against 3.5 for a start on a migrated one (measured on the 2-core machine). Every new home
would pay it again: a new machine, a second checkout, every test that starts its own server.
The migrated, still empty database is the same for one Prefect version, so it is made once in
hvdflow's cache (``$HVDFLOW_CACHE_DIR``, else ``~/.cache/hvdflow``) and copied into each new home.
A user who points Prefect at a database of their own (``PREFECT_SERVER_DATABASE_CONNECTION_URL``)
gets no copy: Prefect migrates theirs as always.
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
# Bounds the one migration that makes the template (7 s on the 2-core machine).
MIGRATE_TIMEOUT_S = 300.0


def seed_prefect_database(home: Path, env: dict[str, str]) -> bool:
    """Copy the migrated template into ``home`` when it has no database yet; True if copied.

    ``env`` is the server's environment. Best effort: when the template cannot be made, the
    server migrates a new database itself, as it would without this.
    """
    target = home / DATABASE_NAME
    if target.exists() or any(env.get(name) for name in CONNECTION_URL_VARIABLES):
        return False
    try:
        template = prefect_database_template(env)
        partial = target.with_name(target.name + ".copying")
        shutil.copyfile(template, partial)
        os.replace(partial, target)
    except (OSError, subprocess.SubprocessError, TimeoutError) as e:
        said = getattr(e, "stderr", None) or b""
        logger.warning(
            "Prefect will create its database itself (no migrated copy: %s %s)",
            e,
            said.decode(errors="replace")[-2000:],
        )
        return False
    return True


def prefect_database_template(env: dict[str, str]) -> Path:
    """The cache's migrated, empty database for the installed Prefect; made when missing."""
    version = importlib.metadata.version("prefect")
    template = cache_root() / "prefect" / f"empty-{version}.db"
    if template.exists():
        return template
    with machine_lock(f"{template}.lock", MIGRATE_TIMEOUT_S, "the Prefect database template"):
        if template.exists():  # another process made it while this one waited
            return template
        template.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=template.parent) as scratch:
            prefect = str(Path(sys.executable).parent / "prefect")
            subprocess.run(
                [prefect, "server", "database", "upgrade", "-y"],
                env={**env, "PREFECT_HOME": scratch},
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                timeout=MIGRATE_TIMEOUT_S,
                check=True,
            )
            os.replace(Path(scratch) / DATABASE_NAME, template)
        logger.info("made the Prefect %s database template %s", version, template)
    return template
