"""Start and stop a local service process (object store, tracking server) cleanly."""

from __future__ import annotations

import os
import signal
import subprocess
import time
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


def wait_until_ready(
    process: subprocess.Popen | None,
    probe,
    *,
    what: str,
    timeout_s: float,
    setting: str,
    log_path: Path,
    interval_s: float = 0.3,
) -> None:
    """Poll ``probe()`` (True when ready; may raise while not) until it passes.

    Fails at once if the process exits, and after ``timeout_s`` naming ``setting``, the constant
    that sets it, and the last error the probe saw.
    """
    deadline = time.monotonic() + timeout_s
    last_error = "no answer yet"
    while time.monotonic() < deadline:
        if process is not None and process.poll() is not None:
            raise RuntimeError(
                f"{what} exited with code {process.returncode} at start; see {log_path}"
            )
        try:
            if probe():
                return
        except Exception as e:  # not ready yet: keep polling
            last_error = f"{type(e).__name__}: {e}"
        time.sleep(interval_s)
    raise RuntimeError(
        f"{what} was not ready within {timeout_s:g} s ({setting}; last error: {last_error}); "
        f"see {log_path}"
    )
