"""Progress a person can follow in a log: one line per update, at most one every few seconds.

A long step (a Spark stage, a large upload or download) reports how far it is with counts and a
rate, as log lines that sit between the others (no carriage returns, no bars): the terminal, the
log file and Prefect's run logs all show the same lines. The decisions (when to report, what the
line says) are pure functions of plain values, tested without clocks or sockets.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

# Seconds between two progress lines of one step: often enough to see it move, rarely enough that
# a long step does not flood the log.
EVERY_S = 5.0


def human_bytes(n: float) -> str:
    """``1.5 MiB``: binary units, one decimal from KiB on."""
    if abs(n) < 1024:
        return f"{n:.0f} B"
    for unit in ("KiB", "MiB", "GiB"):
        n /= 1024
        if abs(n) < 1024:
            return f"{n:.1f} {unit}"
    return f"{n / 1024:.1f} TiB"


def bytes_line(what: str, done: int, total: int | None, seconds: float) -> str:
    """``uploading x: 120.0 MiB of 500.0 MiB (24%), 35.2 MiB/s, about 11 s left``."""
    rate = done / seconds if seconds > 0 else 0.0
    shown = human_bytes(done)
    if total:
        shown += f" of {human_bytes(total)} ({100 * done / total:.0f}%)"
    line = f"{what}: {shown}, {human_bytes(rate)}/s"
    if total and rate > 0 and done < total:
        line += f", about {(total - done) / rate:.0f} s left"
    return line


def tasks_line(
    stage_id: int, name: str, done: int, total: int, running: int, rate: float | None
) -> str:
    """``Spark stage 3 (save at ...): 12/40 tasks done (30%), 2 running, 1.5 tasks/s``."""
    percent = f" ({100 * done / total:.0f}%)" if total else ""
    line = f"Spark stage {stage_id} ({name}): {done}/{total} tasks done{percent}, {running} running"
    if rate is not None:
        line += f", {rate:.2f} tasks/s"
    return line


class ByteProgress:
    """Counts bytes as a transfer reports them (``progress(n)``, from any thread) and logs a
    line at most every ``every_s`` seconds; ``finish()`` logs the total and the mean rate.

    ``log``: a function taking one string (``logger.info``). boto3 calls a transfer's callback
    from its worker threads with the bytes moved since the last call: pass the object itself as
    ``Callback``.
    """

    def __init__(
        self,
        what: str,
        total: int | None,
        log: Callable[[str], object],
        every_s: float = EVERY_S,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.what, self.total, self._log, self._every_s, self._clock = (
            what,
            total,
            log,
            every_s,
            clock,
        )
        self.done = 0
        self._started = clock()
        self._last = self._started
        self._lock = threading.Lock()

    def __call__(self, n: int) -> None:
        with self._lock:
            self.done += n
            now = self._clock()
            if now - self._last < self._every_s:
                return
            self._last = now
            line = bytes_line(self.what, self.done, self.total, now - self._started)
        self._log(line)

    def finish(self) -> None:
        """Log ``what: done, 500.0 MiB in 14.2 s (35.2 MiB/s)``."""
        seconds = self._clock() - self._started
        rate = self.done / seconds if seconds > 0 else 0.0
        self._log(
            f"{self.what}: done, {human_bytes(self.done)} in {seconds:.1f} s "
            f"({human_bytes(rate)}/s)"
        )
