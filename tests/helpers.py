"""Helpers shared by tests: finding rank processes that outlive their run."""

from __future__ import annotations

import os
import time
import uuid

import psutil

RANK_ENTRY = "infra.launcher._rank"
# Set in this test session's environment before any Spark JVM or rank starts, so every rank it
# launches inherits it: another session's ranks on the same machine are not this one's leaks.
TEST_SESSION_VAR = "HVDFLOW_TEST_SESSION"
os.environ.setdefault(TEST_SESSION_VAR, uuid.uuid4().hex)


def rank_processes() -> list[psutil.Process]:
    """Every live HorovodRunner rank process that this test session started."""
    session = os.environ[TEST_SESSION_VAR]
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        cmdline = proc.info.get("cmdline") or []
        if RANK_ENTRY not in cmdline:
            continue
        try:
            if proc.environ().get(TEST_SESSION_VAR) != session:
                continue
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
        found.append(proc)
    return found


def wait_for_no_ranks(timeout_s: float = 10.0) -> list[psutil.Process]:
    """Wait until no rank process is left; return those still alive at the deadline."""
    deadline = time.monotonic() + timeout_s
    while (alive := rank_processes()) and time.monotonic() < deadline:
        time.sleep(0.2)
    return alive
