"""The driver channel's messages: one JSON object per line over a TCP connection.

Tasks send ``hello`` (with the run's token), ``plan`` (partition 0 only; the driver answers
``plan_ok`` once the rendezvous server knows the plan), ``line`` (one line of rank output),
``event`` (a rank reached ``hvd.init()``) and ``failed`` (a rank ended badly, with the tail of its
output). The driver closes the connections to abort a run: a task that sees the close kills its
rank.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from dataclasses import dataclass
from typing import Any, BinaryIO

HELLO = "hello"
PLAN = "plan"
PLAN_OK = "plan_ok"
LINE = "line"
EVENT = "event"
FAILED = "failed"

# Output streams of a rank: its stdout and stderr, and messages sent with log_to_driver().
STDOUT = "stdout"
STDERR = "stderr"
CALLBACK = "log"


@dataclass(frozen=True)
class LogLine:
    """One line a rank wrote, stamped with the time the supervising task read it."""

    time: float
    rank: int
    stream: str
    text: str

    @property
    def prefix(self) -> str:
        """mpirun's tag (``[1,<rank>]<stdout>:``), which tools that read Horovod logs expect."""
        return f"[1,{self.rank}]<{self.stream}>:"

    def formatted(self) -> str:
        return f"{self.prefix}{self.text}"

    def to_log_file_line(self) -> str:
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(self.time))
        return f"{stamp}.{int(self.time % 1 * 1e6):06d} {self.formatted()}"


def encode(message: dict[str, Any]) -> bytes:
    return (json.dumps(message, separators=(",", ":")) + "\n").encode()


def read_message(stream: BinaryIO) -> dict[str, Any] | None:
    """The next message, or None when the other side closed the connection."""
    raw = stream.readline()
    if not raw:
        return None
    return json.loads(raw)


class Connection:
    """A socket with a lock around writes, since several reader threads share one connection."""

    def __init__(self, sock: socket.socket):
        self.sock = sock
        self.reader = sock.makefile("rb")
        self._write_lock = threading.Lock()

    def send(self, message: dict[str, Any]) -> None:
        data = encode(message)
        with self._write_lock:
            self.sock.sendall(data)

    def receive(self) -> dict[str, Any] | None:
        try:
            return read_message(self.reader)
        except (OSError, ValueError):
            return None

    def close(self) -> None:
        # Shut the socket down first: that wakes a thread blocked in reader.readline(). Closing
        # the buffered reader itself would wait for the lock that blocked thread holds.
        for close in (lambda: self.sock.shutdown(socket.SHUT_RDWR), self.sock.close):
            try:
                close()
            except OSError:
                pass
