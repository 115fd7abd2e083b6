"""What the services tests look at: which processes of a group still run."""

from __future__ import annotations

import os

import psutil


def running_in_group(pgid: int) -> list[int]:
    """Pids of the processes of group ``pgid`` that have not exited (zombies left out)."""
    found = []
    for process in psutil.process_iter(["status"]):
        try:
            if os.getpgid(process.pid) == pgid and process.info["status"] != "zombie":
                found.append(process.pid)
        except ProcessLookupError:
            pass
    return found
