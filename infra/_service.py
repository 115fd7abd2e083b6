"""Start and stop a local service process (object store, tracking server) cleanly."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path


def start_process(command: list[str], log_path: Path, env: dict[str, str] | None = None):
    """Run ``command`` in its own process group, output appended to ``log_path``."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("ab") as log:
        return subprocess.Popen(
            command,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            start_new_session=True,  # its group: stopping it stops its workers too
        )


def stop_process(process: subprocess.Popen | None, timeout_s: float) -> None:
    """SIGTERM the process group; SIGKILL whatever is left after ``timeout_s``."""
    if process is None or process.poll() is not None:
        return
    try:
        os.killpg(process.pid, signal.SIGTERM)
        process.wait(timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait(5)
    except ProcessLookupError:
        pass
