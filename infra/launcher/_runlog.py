"""The driver's record of one run's rank output: the log file, the rank logger, the tails."""

from __future__ import annotations

import collections
import logging
import threading

from hvdflow.infra.launcher import _wire

# The driver's logger for rank output (``driver_log_verbosity`` chooses which lines reach it).
rank_logger = logging.getLogger("hvdflow.infra.launcher.runner.ranks")


class RunLog:
    """Where the driver puts the rank output lines its channel receives during one run.

    Every line goes to the run's log file (``driver.log``) and to the user's ``on_log_line``;
    the lines ``driver_log_verbosity`` selects also go to the driver's ``...runner.ranks``
    logger. It receives every stream (stdout, stderr and ``log_to_driver`` messages alike);
    ``log_to_driver`` is the rank-side call that sends one of them.
    """

    def __init__(self, path: str, verbosity: str, consumer):
        self._file = open(path, "a", buffering=1, encoding="utf-8")
        self._lock = threading.Lock()
        self._verbosity = verbosity
        self._consumer = consumer
        # The last lines of each rank, for an error about a rank that cannot report its own.
        self._tails: dict[int, collections.deque[str]] = {}

    def tail(self, rank: int) -> list[str]:
        with self._lock:
            return list(self._tails.get(rank, ()))

    def __call__(self, line: _wire.LogLine) -> None:
        with self._lock:
            self._file.write(line.to_log_file_line() + "\n")
            tail = self._tails.setdefault(line.rank, collections.deque(maxlen=_wire.TAIL_LINES))
            tail.append(_wire.tail_line(line.formatted()))
        if self._verbosity == "all" or line.stream == _wire.CALLBACK:
            rank_logger.info("%s", line.formatted())
        if self._consumer is not None:
            self._consumer(line)

    def __enter__(self) -> RunLog:
        return self

    def __exit__(self, *exc) -> None:
        with self._lock:
            self._file.close()
