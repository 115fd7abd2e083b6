"""Standard output and error that outlive their reader.

A flow run started by a Prefect worker writes to pipes that the worker reads. When the worker
dies (SIGKILLed, its container stopped), the flow run goes on alone, and its next write to a pipe
without a reader raises ``BrokenPipeError``. MLflow's ``end_run`` prints the run's link on
``sys.stdout``: the training had finished and registered, and its task failed there, so Prefect
ran it again. ``outlive_reader`` makes both streams point to ``os.devnull`` from the first such
write on: the run's own records (the Prefect API's logs, the run's log file, MLflow) are where
its output is kept, and they are unaffected.
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
        logger.warning(
            "%s's reader is gone (the process that started this one, such as a Prefect worker, "
            "ended); going on without it: this run's logs are kept in Prefect and its log file",
            self._name,
        )


def outlive_reader() -> None:
    """Makes ``sys.stdout`` and ``sys.stderr`` survive their reader's end (once per process)."""
    for name in ("stdout", "stderr"):
        stream = getattr(sys, name)
        if stream is None or isinstance(stream, _OutlivesReader):
            continue
        try:
            stream.fileno()
        except (AttributeError, OSError, ValueError):
            continue  # not a file (a test's capture, a notebook): nothing to redirect
        setattr(sys, name, _OutlivesReader(stream, name))
