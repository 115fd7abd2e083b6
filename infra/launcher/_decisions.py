"""The launcher's decisions, as pure functions of what was observed: why a task stops its rank,
how a rank's exit reads, and which failure caused the others. Tested with exact values
(tests/infra/launcher/test_decisions.py); the threads that observe live in ``_task`` and
``_channel``.
"""

from __future__ import annotations

import re
import signal
from collections.abc import Mapping, Sequence
from typing import Any

from hvdflow.infra.launcher import _wire
from hvdflow.infra.launcher._engines import engine as engine_row

# What a rank prints when it fails only because another rank died first: Horovod's shutdown
# message, or Gloo's transport finding its peer's socket gone in the middle of a collective
# (a SIGKILLed peer; seen as "[.../gloo/transport/tcp/pair.cc:589] Read error [...]: Connection
# reset by peer").
HOROVOD_SHUTDOWN = "Horovod has been shut down"
GLOO_TRANSPORT = "gloo/transport/"
PEER_GONE = ("Connection reset by peer", "Connection closed by peer", "Broken pipe")
# The tf_collective engine's equivalent: a collective aborted because a peer's socket closed,
# seen when rank 1 was SIGKILLed mid-training: "UnavailableError: {{function_node ...}}
# Collective ops is aborted by: Socket closed" (TensorFlow 2.15), "... aborted by:
# recvmsg:Connection reset by peer" (2.21).
TF_COLLECTIVE_ABORTED = "Collective ops is aborted by: "
TF_PEER_GONE = ("Socket closed", "Connection reset by peer")


def _peer_died_first(line: str) -> bool:
    if HOROVOD_SHUTDOWN in line:
        return True
    if TF_COLLECTIVE_ABORTED in line:
        why = line.split(TF_COLLECTIVE_ABORTED, 1)[1]
        return any(gone in why for gone in TF_PEER_GONE)
    return GLOO_TRANSPORT in line and any(gone in line for gone in PEER_GONE)


def root_failure(failures: Sequence[Mapping[str, Any]]) -> tuple[Mapping | None, list[int]]:
    """The failure report that caused the others, and the ranks of the others, sorted.

    Each report has ``rank``, ``reason``, ``tail`` (its last output lines) and ``exited_at``.
    When one rank dies, its peers fail in their next collective with Horovod's "has been shut
    down" message or a Gloo transport error naming the peer's connection as gone, sometimes
    before the first report arrives (each task notices its rank's exit on its own poll): prefer
    a failure that is not such a consequence, then the earliest exit.
    """
    if not failures:
        return None, []

    def consequence(failure: Mapping[str, Any]) -> bool:
        return any(_peer_died_first(line) for line in failure.get("tail") or [])

    ordered = sorted(failures, key=lambda f: (consequence(f), f.get("exited_at", 0.0)))
    root = ordered[0]
    return root, sorted({f["rank"] for f in ordered[1:]} - {root["rank"]})


def stop_reason(
    *,
    aborted: bool,
    driver_silent: bool,
    init_reached: bool,
    waited_s: float,
    start_timeout_s: float,
    heartbeat_timeout_s: float,
    engine: str = _wire.HOROVOD,
) -> tuple[str, str] | None:
    """Why a task stops its rank, still running, now, and the cause (``_wire.CAUSE_*``); None
    to let it run. ``aborted``: the driver cancelled the run; ``driver_silent``: nothing heard
    from the driver for ``heartbeat_timeout_s``; ``waited_s``: since the rank started, which
    counts against ``start_timeout_s`` until it reached its engine's start (its row's
    ``start_point``, ``_engines``)."""
    if aborted:
        return "stopped: the driver cancelled the run", _wire.CAUSE_STOPPED
    if driver_silent:
        return (
            f"stopped: heard nothing from the driver for {heartbeat_timeout_s:g} s "
            "(HorovodRunner heartbeat_timeout_s); the driver, or the network to it, is gone",
            _wire.CAUSE_LOST,
        )
    if not init_reached and waited_s > start_timeout_s:
        start = engine_row(engine).start_point
        return (
            f"did not reach {start} within {start_timeout_s:g} s "
            f"(HorovodRunner start_timeout_s): raise it if main does slow work before "
            f"{start}, or look for a rank stuck at start in its output",
            _wire.CAUSE_START_TIMEOUT,
        )
    return None


def reached_in_time(reached_after_s: float | None, start_timeout_s: float) -> bool:
    """Whether a rank reached its engine's start within ``start_timeout_s`` of its own start
    (``reached_after_s``; None: not yet). A task looks every poll, so a rank that got there
    between two looks, after the timeout, would otherwise pass."""
    return reached_after_s is not None and reached_after_s <= start_timeout_s


def exit_reason(returncode: int) -> str:
    """How a non-zero exit status reads in an error: a negative one is the signal that killed it."""
    if returncode == _wire.EXIT_TEMPFAIL:
        return f"exited with code {returncode} (a temporary failure: another attempt may succeed)"
    if returncode >= 0:
        return f"exited with code {returncode}"
    try:
        name = signal.Signals(-returncode).name
    except ValueError:
        name = f"signal {-returncode}"
    return f"was killed by {name} (exit {returncode})"


def exit_cause(returncode: int) -> str:
    """The cause of a non-zero exit: a signal (transient: killed from outside), EX_TEMPFAIL
    (transient: the rank raised a TransientError), or another exit status (the training function
    failed: it would fail the same way again)."""
    if returncode < 0:
        return _wire.CAUSE_SIGNAL
    return _wire.CAUSE_UNAVAILABLE if returncode == _wire.EXIT_TEMPFAIL else _wire.CAUSE_EXIT


# The last line of a Python traceback: the exception's (dotted) class name and its message.
_EXCEPTION_LINE = re.compile(r"^(?:[A-Za-z_]\w*\.)*([A-Za-z_]\w*(?:Error|Exception|Failed)): (.+)$")


def error_line(tail: Sequence[str], limit: int = 400) -> str | None:
    """The exception a rank's output ends with (``ObjectStoreError: object store at ...``),
    for the first line of the error: what a person reads first says what happened. None when
    no line of ``tail`` is one."""
    texts = [
        line.split(">:", 1)[1] if line.startswith("[") and ">:" in line else line for line in tail
    ]
    for text in reversed(texts):
        match = _EXCEPTION_LINE.match(text.strip())
        if match and not _peer_died_first(text):
            found = f"{match.group(1)}: {match.group(2)}"
            if match.group(1) == "UnavailableError" and (ranks := _tf_unhealthy_ranks(texts)):
                found = (
                    f"UnavailableError: {' and '.join(f'rank {r}' for r in ranks)} stopped "
                    "sending heartbeats (TensorFlow's coordination service aborted the "
                    "collectives: its host unreachable, or its process stopped)"
                )
            elif match.group(1) == "DeadlineExceededError" and _TF_HEARTBEAT_RPC in texts:
                found = (
                    "DeadlineExceededError: TensorFlow's coordination service, on rank 0, did "
                    "not answer this rank's heartbeats in time (rank 0's host unreachable, or "
                    "its process stopped)"
                )
            return found if len(found) <= limit else found[: limit - 3] + "..."
    return None


# TensorFlow's coordination service, when workers stop sending heartbeats. TensorFlow 2.21: "The
# following tasks are unhealthy (stopped sending heartbeats):", then one
# "/job:worker/replica:0/task:N" line each; 2.15: "Task /job:worker/replica:0/task:N heartbeat
# timeout". A worker's task index is its rank (``_placement.tf_config``).
_TF_UNHEALTHY = "tasks are unhealthy (stopped sending heartbeats)"
# The call a worker's DEADLINE_EXCEEDED names when the coordination service did not answer it.
_TF_HEARTBEAT_RPC = "RPC: /tensorflow.CoordinationService/Heartbeat"
_TF_TASK = re.compile(r"^/job:worker/replica:\d+/task:(\d+)$")
_TF_TASK_TIMEOUT = re.compile(r"Task /job:worker/replica:\d+/task:(\d+) heartbeat timeout")


def _tf_unhealthy_ranks(texts: Sequence[str]) -> list[int]:
    ranks = set()
    for i, text in enumerate(texts):
        ranks |= {int(n) for n in _TF_TASK_TIMEOUT.findall(text)}
        if _TF_UNHEALTHY in text:
            for after in texts[i + 1 :]:
                if not (task := _TF_TASK.match(after.strip())):
                    break
                ranks.add(int(task.group(1)))
    return sorted(ranks)
