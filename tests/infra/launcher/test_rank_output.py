"""A rank's output as its task reads it: log_to_driver messages in order with its prints."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading

import pytest

from hvdflow.infra.constants import HVDFLOW_EVENT_FD
from hvdflow.infra.launcher import _task, _wire
from hvdflow.infra.launcher._wire import LOG_TO_DRIVER_CHARS, TRUNCATED_SUFFIX

pytestmark = pytest.mark.unit

ROUNDS = 300
# The longest message, in characters JSON escapes the most (a surrogate pair each).
WIDEST = "\U0001f600" * (LOG_TO_DRIVER_CHARS + 50)

# A rank's habits, run for real in a process with the rank's pipes.
TALKER = textwrap.dedent(
    f"""
    import sys
    from hvdflow import log_to_driver
    from hvdflow.infra.launcher._wire import report_progress
    for i in range({ROUNDS}):
        print(f"out {{i}}")
        print(f"err {{i}}", file=sys.stderr)
        log_to_driver(f"log {{i}}")
        report_progress(i, i)
    print("epoch 1/1 [====]", end="\\r")  # a progress bar leaves no newline
    log_to_driver("two\\nlines")
    log_to_driver({WIDEST!r})
    print("last")
    """
)


def read_talker() -> tuple[list[tuple[str, str]], list[tuple[int, int, bool]]]:
    events_read, events_write = os.pipe()
    proc = subprocess.Popen(
        [sys.executable, "-c", TALKER],
        env={**os.environ, HVDFLOW_EVENT_FD: str(events_write), "PYTHONUNBUFFERED": "1"},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        pass_fds=(events_write,),
    )
    os.close(events_write)
    shipped: list[tuple[str, str]] = []
    progress: list[tuple[int, int, bool]] = []
    readers = _task.start_readers(
        proc,
        events_read,
        lambda stream, text, at=None: shipped.append((stream, text)),
        threading.Event(),
        lambda *noted: progress.append(noted),
    )
    assert proc.wait(timeout=60) == 0
    for t in readers:
        t.join(timeout=10)
    return shipped, progress


def test_log_to_driver_messages_arrive_in_order_with_what_the_rank_printed():
    shipped, progress = read_talker()
    in_order = [(stream, text) for stream, text in shipped if stream != _wire.STDERR]
    assert in_order == [
        *(
            (stream, f"{word} {i}")
            for i in range(ROUNDS)
            for stream, word in ((_wire.STDOUT, "out"), (_wire.CALLBACK, "log"))
        ),
        (_wire.STDOUT, "epoch 1/1 [====]\r"),
        (_wire.CALLBACK, "two\nlines"),
        (_wire.CALLBACK, WIDEST[:LOG_TO_DRIVER_CHARS] + TRUNCATED_SUFFIX),
        (_wire.STDOUT, "last"),
    ]
    assert [text for stream, text in shipped if stream == _wire.STDERR] == [
        f"err {i}" for i in range(ROUNDS)
    ]
    assert progress == [(i, i, True) for i in range(ROUNDS)]
