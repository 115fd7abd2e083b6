"""A lock that holds across threads and processes on one machine (fcntl on a lock file)."""

from __future__ import annotations

import fcntl
import os
import threading
import time
from contextlib import contextmanager
from pathlib import Path

from hvdflow.infra.constants import HVDFLOW_CACHE_DIR

_thread_locks: dict[str, threading.Lock] = {}
_guard = threading.Lock()


@contextmanager
def machine_lock(path: str | Path, timeout_s: float = 600.0, what: str = "the lock"):
    """Exclusive lock on ``path``; waits at most ``timeout_s``, then raises TimeoutError."""
    path = str(path)
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with _guard:
        thread_lock = _thread_locks.setdefault(path, threading.Lock())
    # flock is per open file: threads of one process need their own lock on top.
    if not thread_lock.acquire(timeout=timeout_s):
        raise TimeoutError(f"waited {timeout_s:g} s for {what} ({path})")
    try:
        with open(path, "a") as f:
            deadline = time.monotonic() + timeout_s
            while True:
                try:
                    fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() > deadline:
                        raise TimeoutError(
                            f"waited {timeout_s:g} s for {what} ({path}): another process holds it"
                        ) from None
                    time.sleep(0.05)
            try:
                yield
            finally:
                fcntl.flock(f, fcntl.LOCK_UN)
    finally:
        thread_lock.release()


def cache_root() -> Path:
    """``$HVDFLOW_CACHE_DIR``, else ``~/.cache/hvdflow``: per machine, shared by its ranks."""
    root = os.environ.get(HVDFLOW_CACHE_DIR)
    return Path(root) if root else Path.home() / ".cache" / "hvdflow"
