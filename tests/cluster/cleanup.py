"""Removing what harness runs leave: at `down`, at the next run's start, and by a watchdog.

A run's own teardown removes everything on every path Python still controls. What it cannot
cover (pytest killed with SIGKILL, a machine-wide timeout) is covered twice: a watchdog process
that outlives its owner and removes the run when the owner dies, and ``down`` (also run at the
start of every test session), which removes every run whose owner is gone.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from tests.cluster import netns, processes, registry

logger = logging.getLogger(__name__)

# How long `down` waits for a live `up` process to tear its own cluster down after SIGTERM.
STOP_UP_WAIT_S = 60.0
# How often the watchdog checks on its owner.
WATCH_POLL_S = 0.5
PROJECT_ROOT = Path(__file__).resolve().parents[2]


def remove_run(record: registry.RunRecord) -> list[str]:
    """Remove run ``record`` whatever state it is in; what could not be removed."""
    for pid, started in record.pids.values():
        if processes.is_alive(int(pid), started):
            processes.kill_pids([int(pid)], grace_s=5)
    problems = netns.destroy(record.tag)
    if not problems:
        registry.release(record)
    return problems


def down(stop_live: tuple[str, ...] = ("up",)) -> list[str]:
    """Remove crashed runs and orphaned names, and stop the live runs of the kinds in
    ``stop_live`` ("up", "pytest"); one line per thing done, for the person who asked."""
    # Names before records: a run writes its record before its first name, so any name seen
    # here belongs to a record read below, or to no live run at all.
    names = netns.found_names()
    report = []
    for record in registry.records():
        # Whatever happens to the run below, its names are its own: never "orphans".
        names.pop(record.tag, None)
        alive = record.owner_alive()
        if alive and record.kind not in stop_live:
            report.append(f"left live {record.kind} run {record.tag} (pid {record.owner_pid})")
            continue
        if alive:
            os.kill(record.owner_pid, signal.SIGTERM)  # it tears down its own cluster
            deadline = time.monotonic() + STOP_UP_WAIT_S
            while record.path.exists() and time.monotonic() < deadline:
                time.sleep(0.2)
            report.append(f"stopped {record.kind} run {record.tag} (pid {record.owner_pid})")
        if record.path.exists():
            problems = remove_run(record)
            report.append(
                f"removed run {record.tag}"
                + (f"; could not remove: {'; '.join(problems)}" if problems else "")
            )
    for tag in names:
        problems = netns.destroy(tag)
        report.append(
            f"removed orphaned names of run {tag}"
            + (f"; could not remove: {'; '.join(problems)}" if problems else "")
        )
    return report


def start_watchdog(record: registry.RunRecord, log: Path) -> subprocess.Popen:
    """A process that removes run ``record`` if its owner dies without tearing it down."""
    return processes.start(
        [sys.executable, "-m", "tests.cluster", "watch", record.tag],
        log=log,
        env={**os.environ, "PYTHONPATH": str(PROJECT_ROOT)},
        cwd=str(PROJECT_ROOT),
    )


def watch(tag: str) -> int:
    """Wait until run ``tag`` is torn down (return) or its owner dies (remove it, return)."""
    while True:
        record = next((r for r in registry.records() if r.tag == tag), None)
        if record is None:
            return 0
        if not record.owner_alive():
            problems = remove_run(record)
            logger.warning("owner of run %s died; removed it (problems: %s)", tag, problems)
            return 1 if problems else 0
        time.sleep(WATCH_POLL_S)
