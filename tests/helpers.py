"""Helpers shared by tests: finding rank processes that outlive their run."""

from __future__ import annotations

import time

import psutil

RANK_ENTRY = "infra.launcher._rank"


def rank_processes() -> list[psutil.Process]:
    """Every live HorovodRunner rank process on this machine."""
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        cmdline = proc.info.get("cmdline") or []
        if RANK_ENTRY in cmdline:
            found.append(proc)
    return found


def wait_for_no_ranks(timeout_s: float = 10.0) -> list[psutil.Process]:
    """Wait until no rank process is left; return those still alive at the deadline."""
    deadline = time.monotonic() + timeout_s
    while (alive := rank_processes()) and time.monotonic() < deadline:
        time.sleep(0.2)
    return alive
