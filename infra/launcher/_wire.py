"""The launcher's two contracts, imported by both ends of each: one JSON object per line.

Driver <-> task, over TCP (or through the object store, ``_relay``): the message types below.
The driver closes the connections to abort a run. A cut network closes nothing, so each side
gives the other up after ``heartbeat_timeout_s`` without a message (``_decisions``).

Rank -> task, over an inherited pipe: ``EVENT_*``. A ``log_to_driver()`` message goes on the
rank's stdout instead (``LOG_LINE_MARKER``), in order with what it printed.
"""

from __future__ import annotations

import codecs
import json
import logging
import os
import socket
import sys
import threading
import time
from dataclasses import dataclass
from typing import Any, BinaryIO

from hvdflow.infra import constants as c
from hvdflow.infra.constants import HVDFLOW_EVENT_FD

logger = logging.getLogger(__name__)

# --- Driver <-> task message types ---
HELLO = "hello"  # the run's token, the task's partition, its host's name
PLAN = "plan"  # the stage's task hosts, from every task; the driver answers PLAN_OK
PLAN_OK = "plan_ok"
# This task's part of the run's one exchange; once all have come, the driver answers every task
# with GATHERED, the parts in partition order.
GATHER = "gather"
GATHERED = "gathered"
LINE = "line"  # a line of rank output
FAILED = "failed"  # a rank ended badly, with the tail of its output
# The task's last message: a connection that ends without it lost its task.
BYE = "bye"
# Each task's, every HEARTBEAT_INTERVAL_S, answered by the driver: proof of life both ways. It
# carries the rank's progress (EVENT_PROGRESS), from which the driver tells a stalled rank.
HEARTBEAT = "heartbeat"
# Driver -> every task, when the run stalled; each answers STACKS (its rank, faulthandler's text).
DUMP_STACKS = "dump_stacks"
STACKS = "stacks"

# How often a task sends a heartbeat, in seconds.
HEARTBEAT_INTERVAL_S = 2.0
# The shortest heartbeat_timeout_s accepted, in intervals: one late heartbeat must not fail a run.
MIN_HEARTBEATS_PER_TIMEOUT = 3
# The default heartbeat_timeout_s: rides out a driver's pause or a busy executor.
DEFAULT_HEARTBEAT_TIMEOUT_S = 60.0
# Longest host name in a hello: Linux's HOST_NAME_MAX; escaped, it fits _driver.HELLO_MAX_BYTES.
MAX_HOSTNAME_CHARS = 64

# --- Engines: what the ranks synchronise with (named in infra.constants) ---
HOROVOD, TF_COLLECTIVE, TORCH = c.HOROVOD, c.TF_COLLECTIVE, c.TORCH

# --- Rank -> task events, on the pipe named by HVDFLOW_EVENT_FD ---
# The rank joined (returned from hvd.init(), created its strategy, ...): start_timeout_s is over.
EVENT_INIT = "init"
# Training progress: batches ``begun`` and ``finished`` so far, and whether the stall watch
# applies (``watch`` is false outside the batch loop, e.g. while rank 0 uploads the model).
EVENT_PROGRESS = "progress"

# Why a rank failed, in every failure report (``cause``): the training step retries the
# transient ones (a killed process, a lost host, a stall), never a Python error in main.
CAUSE_EXIT = "exit"
CAUSE_SIGNAL = "signal"
CAUSE_LOST = "lost"
CAUSE_STALLED = "stalled"
CAUSE_START_TIMEOUT = "start_timeout"
CAUSE_STOPPED = "stopped"
CAUSE_HOST = "host"
# The rank exited with EX_TEMPFAIL: a service it needs (the object store) was unreachable.
CAUSE_UNAVAILABLE = "unavailable"
# The driver failed reading a task's messages (full disk, no memory): not the rank's fault.
CAUSE_DRIVER = "driver"
TRANSIENT_CAUSES = frozenset(
    {CAUSE_SIGNAL, CAUSE_LOST, CAUSE_STALLED, CAUSE_UNAVAILABLE, CAUSE_DRIVER}
)
# sysexits.h's EX_TEMPFAIL: the status of a rank whose main raised an exception with a true
# ``transient`` attribute.
EXIT_TEMPFAIL = 75
# Longest stack dump a task ships per rank, in characters (the tail of a longer one is dropped).
MAX_STACKS_CHARS = 16 * 1024

# Output streams of a rank: its stdout and stderr, and messages sent with log_to_driver().
STDOUT = "stdout"
STDERR = "stderr"
CALLBACK = "log"
# A log_to_driver() message travels on the rank's stdout, in order with its prints, as one line:
# this marker, then JSON (``{"text": ..., "time": ...}``). Pure ASCII (JSON's escapes), so the
# longest message (LOG_TO_DRIVER_CHARS, 12 bytes a character at worst) fits MAX_LINE_BYTES.
LOG_LINE_MARKER = "\x00hvdflow-log\x00"
_LOG_LINE_MARKER_BYTES = LOG_LINE_MARKER.encode()

# Longest line of rank output shipped whole, in bytes without the newline: a rank printing one huge
# line cannot exhaust memory. The rest is read and dropped; TRUNCATED (the full length) marks it.
MAX_LINE_BYTES = 64 * 1024
TRUNCATED = " [... line truncated: {total} bytes]"
# Longest message the driver (and a task) accepts, newline included; a longer one closes that
# connection. JSON escaping makes a character at most 12 bytes: a line message and a failure
# report (TAIL_LINES of TAIL_LINE_CHARS) stay well under this.
MAX_MESSAGE_BYTES = 4 * 1024 * 1024
# Lines of output, and characters of each, a failure report carries for the error message.
TAIL_LINES = 40
TAIL_LINE_CHARS = 4000


def log_line(text: str, at: float) -> str:
    """A log_to_driver() message as the line the rank writes to its stdout (no newline)."""
    return LOG_LINE_MARKER + json.dumps({"text": text, "time": at})


def split_log_line(raw: bytes) -> tuple[bytes, tuple[str, float] | None]:
    """A line of a rank's stdout as (what the rank printed, the ``log_line`` message or None).
    The message may follow output left without a newline (a progress bar's ``\\r``); a cut or
    stray line with the marker is output, shown as it is."""
    at = raw.find(_LOG_LINE_MARKER_BYTES)
    if at < 0:
        return raw, None
    try:
        message = json.loads(raw[at + len(_LOG_LINE_MARKER_BYTES) :])
        return raw[:at], (str(message["text"]), float(message["time"]))
    except (ValueError, TypeError, KeyError):
        return raw, None


class MessageTooLarge(ValueError):
    """A message longer than the reader's limit: the sender is broken or not a task."""


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


def read_line(stream: BinaryIO, limit: int = MAX_LINE_BYTES) -> tuple[bytes, int] | None:
    """The next line without its newline, cut to ``limit`` bytes, and its full length in bytes;
    None at the end. The rest of a longer line is read in chunks and dropped."""
    raw = stream.readline(limit + 1)
    if not raw:
        return None
    if raw.endswith(b"\n"):
        return raw[:-1], len(raw) - 1
    if len(raw) <= limit:  # the last line, with no newline before the end of the stream
        return raw, len(raw)
    kept, total = raw[:limit], len(raw)
    while raw and not raw.endswith(b"\n"):
        raw = stream.readline(limit)
        total += len(raw)
    return kept, total - raw.endswith(b"\n")


def line_text(kept: bytes, total: int) -> str:
    """A line read by ``read_line`` as text, with the truncation marker when it was cut."""
    if total <= len(kept):
        return kept.decode("utf-8", "replace")
    # Cut at a byte limit, the line may end inside a character: leave that character out.
    decoder = codecs.getincrementaldecoder("utf-8")("replace")
    return decoder.decode(kept, final=False) + TRUNCATED.format(total=total)


def capped_text(text: str, limit: int = MAX_LINE_BYTES) -> str:
    """``text`` cut to ``limit`` UTF-8 bytes, with the truncation marker when it was cut."""
    data = text.encode("utf-8", "replace")
    return line_text(data[:limit], len(data))


def tail_line(formatted: str) -> str:
    """A line as a failure report keeps it: short enough that the report fits one message."""
    if len(formatted) <= TAIL_LINE_CHARS:
        return formatted
    return formatted[:TAIL_LINE_CHARS] + " [...]"


def encode(message: dict[str, Any]) -> bytes:
    return (json.dumps(message, separators=(",", ":")) + "\n").encode()


def read_message(stream: BinaryIO, limit: int = MAX_MESSAGE_BYTES) -> dict[str, Any] | None:
    """The next message, or None when the other side closed the connection. MessageTooLarge for
    one over ``limit`` bytes (newline included), having read no more than ``limit + 1`` of it."""
    raw = stream.readline(limit + 1)
    if not raw:
        return None
    if len(raw) > limit:
        raise MessageTooLarge(f"a message longer than {limit} bytes")
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

    def receive(self, limit: int = MAX_MESSAGE_BYTES) -> dict[str, Any] | None:
        """The next message; None when the connection ended, timed out or broke the contract. One
        over ``limit`` bytes closes it: what follows may not start at a message boundary."""
        try:
            return read_message(self.reader, limit)
        except MessageTooLarge as e:
            logger.warning("closing a connection that sent %s (MAX_MESSAGE_BYTES)", e)
            self.close()
            self.reader.close()  # this is the reading thread: no other read holds its lock
            return None
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


# --- Rank -> task: what a rank tells its task beyond plain output ---

_lock = threading.Lock()
_pipe = None


def _event_pipe():
    global _pipe
    if _pipe is None:
        fd = os.environ.get(HVDFLOW_EVENT_FD)
        if fd is None:
            return None
        _pipe = os.fdopen(int(fd), "w", buffering=1, closefd=False)
    return _pipe


def emit_event(event: str, **fields) -> bool:
    """Send one event (``EVENT_*``) to the supervising task; False outside a rank. Never raises."""
    with _lock:
        try:
            pipe = _event_pipe()
            if pipe is None:
                return False
            pipe.write(json.dumps({"event": event, "time": time.time(), **fields}) + "\n")
            return True
        except (OSError, ValueError):
            return False  # best effort: a closed pipe must never fail training


# Databricks' log_to_driver: "If message length is greater than 4000, it will be truncated."
LOG_TO_DRIVER_CHARS = 4000
TRUNCATED_SUFFIX = "...(truncated)"


def log_to_driver(message: str) -> None:
    """Show ``message`` on the driver, tagged with this rank, whatever the log verbosity.

    As Databricks' ``sparkdl.horovod.log_to_driver``: a message over 4,000 characters is cut
    there and ends with ``...(truncated)``. It arrives after what the rank printed before it.
    """
    text = str(message)
    if len(text) > LOG_TO_DRIVER_CHARS:
        text = text[:LOG_TO_DRIVER_CHARS] + TRUNCATED_SUFFIX
    if os.environ.get(HVDFLOW_EVENT_FD) is None or not _write_to_stdout(text):
        logger.info("%s", message)


def _write_to_stdout(text: str) -> bool:
    line = log_line(text, time.time()) + "\n"
    with _lock:
        try:
            if sys.stdout is not sys.__stdout__ and sys.stdout is not None:
                sys.stdout.flush()  # user code replaced stdout: what it holds goes first
            sys.__stdout__.write(line)
            sys.__stdout__.flush()
            return True
        except (AttributeError, OSError, ValueError):
            return False  # stdout closed by user code: the message goes to the logger


def report_progress(begun: int, finished: int, watch: bool = True) -> None:
    """Tell the stall watch how many batches this rank has begun and finished so far.

    ``watch=False``: the rank left the batch loop (it evaluates, saves or exits), so no progress
    is expected until it reports with ``watch=True``. A no-op outside a rank; cheap per batch.
    """
    emit_event(EVENT_PROGRESS, begun=int(begun), finished=int(finished), watch=bool(watch))
