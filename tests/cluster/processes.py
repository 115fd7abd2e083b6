"""Starting and stopping the harness's processes, every wait bounded.

Each long-lived process starts in its own session, so stopping its group also stops whatever it
started (a Spark worker's executors and their Python workers). Processes found by id (after a
crash, or inside a namespace) are checked against their start time, so a recycled id is never
killed by mistake.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

import psutil

# How long a process gets after SIGTERM before SIGKILL; a Spark JVM stops in a second or two.
TERM_GRACE_S = 10.0
# How long to wait for the kernel to reap what SIGKILL hit.
KILL_GRACE_S = 5.0


def start(
    argv: Sequence[str], *, log: Path, env: Mapping[str, str], cwd: str | None = None
) -> subprocess.Popen:
    """Start ``argv`` in a new session, its stdout and stderr going to ``log``."""
    with log.open("ab") as out:
        return subprocess.Popen(
            list(argv),
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=dict(env),
            cwd=cwd,
            start_new_session=True,  # its own group: stopping it stops all it started
        )


def stop_groups(procs: Iterable[subprocess.Popen], grace_s: float = TERM_GRACE_S) -> None:
    """SIGTERM each process group, SIGKILL what is left after ``grace_s``, reap the leaders."""
    procs = [p for p in procs if p is not None]
    for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, KILL_GRACE_S)):
        pending = [p for p in procs if p.poll() is None or _group_alive(p.pid)]
        if not pending:
            return
        for proc in pending:
            try:
                os.killpg(proc.pid, sig)
            except ProcessLookupError:
                pass
        for proc in pending:
            try:
                proc.wait(wait_s)
            except subprocess.TimeoutExpired:
                continue
        # A leader that exited may leave group members behind (a JVM's children).
        for proc in pending:
            _wait_group_gone(proc.pid, 0.5)


def kill_pids(pids: Iterable[int], grace_s: float = TERM_GRACE_S) -> list[int]:
    """SIGTERM then SIGKILL these processes; return the ids still alive at the end."""
    procs = []
    for pid in set(pids):
        try:
            procs.append(psutil.Process(pid))
        except psutil.NoSuchProcess:
            continue
    for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, KILL_GRACE_S)):
        for proc in procs:
            try:
                proc.send_signal(sig)
            except psutil.NoSuchProcess:
                pass
        _gone, procs = psutil.wait_procs(procs, timeout=wait_s)
        if not procs:
            return []
    return [p.pid for p in procs]


def identity(pid: int) -> tuple[int, float] | None:
    """(pid, start time): what names one process, across id reuse."""
    try:
        return pid, psutil.Process(pid).create_time()
    except psutil.NoSuchProcess:
        return None


def is_alive(pid: int, started: float) -> bool:
    """Whether the process that had ``pid`` and started at ``started`` still runs."""
    try:
        proc = psutil.Process(pid)
        return abs(proc.create_time() - started) < 0.01 and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
        return True
    except (ProcessLookupError, PermissionError):
        return False


def _wait_group_gone(pgid: int, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while _group_alive(pgid) and time.monotonic() < deadline:
        time.sleep(0.05)
