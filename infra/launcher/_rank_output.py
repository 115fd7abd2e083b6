"""A rank's output, read while it runs: its stdout and stderr lines, and its events.

Three pipes, a thread each. A ``log_to_driver`` message travels on stdout
(``_wire.LOG_LINE_MARKER``), so it reaches the driver in order with what the rank printed; the
event pipe (``rank_events``) carries what only the supervising task reads: ``hvd.init()``
reached, and training progress for the stall watch.
"""

from __future__ import annotations

import json
import os
import subprocess
import threading
import time
from collections.abc import Callable

from hvdflow.infra.launcher import _wire

# ship(stream, text, at=None): one line to the driver, stamped ``at`` or when it was read.
Ship = Callable[..., None]
NoteProgress = Callable[[int, int, bool], None]


def start_readers(
    proc: subprocess.Popen,
    events_fd: int,
    ship: Ship,
    init_reached: threading.Event,
    note_progress: NoteProgress,
) -> list[threading.Thread]:
    """Start reading ``proc``'s stdout, stderr and event pipe; each thread ends at its EOF."""
    readers = [
        threading.Thread(target=_pump_stdout, args=(proc.stdout, ship), daemon=True),
        threading.Thread(target=_pump_stderr, args=(proc.stderr, ship), daemon=True),
        threading.Thread(
            target=_pump_events, args=(events_fd, init_reached, note_progress), daemon=True
        ),
    ]
    for t in readers:
        t.start()
    return readers


def _pump_stdout(pipe, ship: Ship) -> None:
    while (line := _wire.read_line(pipe, _wire.MAX_LINE_BYTES)) is not None:
        kept, total = line
        printed, message = _wire.split_log_line(kept)
        if message is None:
            ship(_wire.STDOUT, _wire.line_text(kept, total))
            continue
        if printed:
            ship(_wire.STDOUT, _wire.line_text(printed, len(printed)))
        ship(_wire.CALLBACK, *message)
    pipe.close()


def _pump_stderr(pipe, ship: Ship) -> None:
    """Ship each line of ``pipe``; a line over MAX_LINE_BYTES goes cut, with a marker."""
    while (line := _wire.read_line(pipe, _wire.MAX_LINE_BYTES)) is not None:
        ship(_wire.STDERR, _wire.line_text(*line))
    pipe.close()


class Reached(threading.Event):
    """Set when the rank reached its engine's start; ``at``: when (``time.monotonic``), so that
    the start timeout is judged by when that happened, not by when a poll noticed it."""

    at: float | None = None

    def set(self) -> None:
        if self.at is None:
            self.at = time.monotonic()
        super().set()


def _pump_events(fd: int, init_reached: threading.Event, note_progress: NoteProgress) -> None:
    with os.fdopen(fd, "rb") as events:
        while (line := _wire.read_line(events, _wire.MAX_MESSAGE_BYTES)) is not None:
            raw, total = line
            if total > len(raw):
                continue  # events are short, so only a stray writer gets here
            try:
                event = json.loads(raw)
            except ValueError:
                continue
            if not isinstance(event, dict):
                continue
            if event.get("event") == _wire.EVENT_INIT:
                init_reached.set()
                note_progress(0, 0, True)  # the stall watch starts at hvd.init()
            elif event.get("event") == _wire.EVENT_PROGRESS:
                note_progress(
                    int(event.get("begun", 0)),
                    int(event.get("finished", 0)),
                    bool(event.get("watch", True)),
                )
