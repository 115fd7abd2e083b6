"""A flow run that outlives the Prefect worker that started it: it goes on, and leaves nothing.

Prefect's process worker starts each run through its workspace supervisor, whose settings it
writes into a temporary folder of its own (``prefect-workspace-attempt-*/supervisor.json``, in
the worker's temporary directory) and removes when the run ends. A worker SIGKILLed (its
container stopped, its machine rebooted) meanwhile never does: the run goes on alone and the
folder would stay in /tmp for good, one per run the dead worker had started.

So each hvdflow flow, when it starts, remembers the worker (its parent: the supervisor has
replaced itself with the run's process by then) and, when its process ends with that worker
gone, removes the folder whose ``supervisor.json`` names its own flow run. Nothing else reads the
folder once the run's process started; a live worker removes it itself (and would fail on a
folder already gone), so it is left to that worker.
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import shutil
import tempfile
from pathlib import Path

from hvdflow.infra.stdio import outlive_reader

logger = logging.getLogger(__name__)

ATTEMPT_PREFIX = "prefect-workspace-attempt-"
SUPERVISOR_CONFIG = "supervisor.json"
FLOW_RUN_ID = "PREFECT__FLOW_RUN_ID"  # set by Prefect for the run's process

_registered = False


def outlive_worker() -> None:
    """What each hvdflow flow calls first: its output survives the worker's pipes going away
    (hvdflow.infra.stdio), and its attempt folder does not outlive it (once per process)."""
    global _registered
    outlive_reader()
    flow_run_id = os.environ.get(FLOW_RUN_ID)
    if flow_run_id and not _registered:
        atexit.register(remove_attempt_folder_if_orphaned, flow_run_id, os.getppid())
        _registered = True


def attempt_folders(flow_run_id: str, where: str | Path | None = None) -> list[Path]:
    """The worker's attempt folders (in ``where``, else the temporary directory) whose supervisor
    settings name ``flow_run_id``."""
    found = []
    for folder in Path(where or tempfile.gettempdir()).glob(ATTEMPT_PREFIX + "*"):
        try:
            settings = json.loads((folder / SUPERVISOR_CONFIG).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue  # another user's, half written, or not Prefect's after all
        if isinstance(settings, dict) and str(settings.get("flow_run_id")) == flow_run_id:
            found.append(folder)
    return found


def remove_attempt_folder_if_orphaned(flow_run_id: str, worker_pid: int) -> list[Path]:
    """Remove this run's attempt folders when the worker that started it (``worker_pid``, this
    process's parent then) is no longer its parent; returns what was removed."""
    if os.getppid() == worker_pid:
        return []  # the worker lives and removes its folder itself
    removed = attempt_folders(flow_run_id)
    for folder in removed:
        shutil.rmtree(folder, ignore_errors=True)
    if removed:
        logger.info(
            "the Prefect worker that started flow run %s (pid %d) is gone: removed its %s",
            flow_run_id,
            worker_pid,
            ", ".join(str(f) for f in removed),
        )
    return removed
