"""Standard output and error that outlive their reader.

When the Prefect worker that reads a flow run's pipes dies, the run goes on alone, and its next
write (MLflow's ``end_run`` prints the run's link) raises ``BrokenPipeError``, failing a finished
training. ``outlive_reader`` points both streams at ``os.devnull`` from the first such write on;
the run's own records (Prefect's logs, the log file, MLflow) are unaffected.

Logging handlers made before it hold the streams as they were: it points them at the stand-ins
too, Rich's console included (Rich meets a broken pipe with ``SystemExit``).
"""

from __future__ import annotations

import logging
import os
import sys
import threading

logger = logging.getLogger(__name__)
_lock = threading.Lock()


class _OutlivesReader:
    """A text stream's stand-in: writes as the stream does until its reader is gone, then to
    ``os.devnull`` through the same file descriptor (so C code, children started later and
    handlers that kept the original stream stop failing too)."""

    def __init__(self, stream, name: str):
        self._stream = stream
        self._name = name
        self.reader_gone = False

    def write(self, text: str) -> int:
        try:
            return self._stream.write(text)
        except BrokenPipeError:
            self._to_devnull()
            return self._stream.write(text)

    def flush(self) -> None:
        try:
            self._stream.flush()
        except BrokenPipeError:
            self._to_devnull()
            self._stream.flush()

    def __getattr__(self, name: str):
        return getattr(self._stream, name)

    def _to_devnull(self) -> None:
        with _lock:
            if self.reader_gone:
                return
            devnull = os.open(os.devnull, os.O_WRONLY)
            try:
                os.dup2(devnull, self._stream.fileno())
            finally:
                os.close(devnull)
            self.reader_gone = True
        # From a thread of its own: this write may come from a logging handler holding its lock,
        # and the warning goes to handlers too.
        threading.Thread(
            target=logger.warning,
            args=(
                "%s's reader is gone (the process that started this one, such as a Prefect "
                "worker, ended); going on without it: this run's logs are kept in Prefect and "
                "its log file",
                self._name,
            ),
            name="hvdflow-reader-gone",
            daemon=True,
        ).start()


def outlive_reader() -> None:
    """Makes ``sys.stdout`` and ``sys.stderr`` survive their reader's end (once per process),
    and the logging handlers that write to them."""
    for name in ("stdout", "stderr"):
        stream = getattr(sys, name)
        if stream is None or isinstance(stream, _OutlivesReader):
            continue
        try:
            stream.fileno()
        except (AttributeError, OSError, ValueError):
            continue  # not a file (a test's capture, a notebook): nothing to redirect
        guarded = _OutlivesReader(stream, name)
        setattr(sys, name, guarded)
        guarded.flush()  # what the stream holds, through the guard: setStream flushes it too
        _point_handlers(stream, guarded)


def _point_handlers(stream, guarded: _OutlivesReader) -> None:
    """Every logging handler that writes to ``stream`` writes through ``guarded`` instead; and
    so does a Rich console a handler prints with (Prefect's console handler)."""
    known = list(logging.Logger.manager.loggerDict.values())  # other threads may add some
    loggers = [logging.getLogger()] + [lg for lg in known if isinstance(lg, logging.Logger)]
    for handler in {h for found in loggers for h in found.handlers}:
        if isinstance(handler, logging.StreamHandler) and handler.stream is stream:
            handler.setStream(guarded)
        console = getattr(handler, "console", None)
        if console is not None and getattr(console, "file", None) is stream:
            console.file = guarded
