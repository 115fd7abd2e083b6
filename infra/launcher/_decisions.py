"""The launcher's decisions as pure functions of what ``_task`` and ``_driver`` observed, and
the driver's thread-safe ``Tracker`` and ``ProgressTracker``.

A cut cable closes no connection, so each side gives the other up after ``heartbeat_timeout_s``
of silence. A deadlocked rank keeps its heartbeats going, so they carry batches begun and
finished: a rank's finished count unchanged for ``stall_timeout_s`` stalls the run, and those
that began the fewest (the others began one more, then waited) are blamed.
"""

from __future__ import annotations

import re
import signal
import threading
import time
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from hvdflow.infra.launcher import _engines, _wire

# --- A rank's end: why it stops, how its exit reads, which failure came first ---

# What a rank prints when it fails only because another died first: Horovod's shutdown, Gloo's
# transport losing its peer, TensorFlow's "Collective ops is aborted by: Socket closed" (2.15) or
# "...: recvmsg:Connection reset by peer" (2.21).
HOROVOD_SHUTDOWN = "Horovod has been shut down"
GLOO_TRANSPORT = "gloo/transport/"
PEER_GONE = ("Connection reset by peer", "Connection closed by peer", "Broken pipe")
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
    """The failure report that caused the others, and the others' ranks, sorted. Peers of a dead
    rank fail in their next collective, sometimes reported first: prefer a failure that is not
    such a consequence, then the earliest exit."""
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
    """Why a task stops its running rank now, and the cause (``_wire.CAUSE_*``); None to let it
    run. ``waited_s`` (since the rank started) counts against ``start_timeout_s`` until it
    reached its engine's ``start_point``."""
    if aborted:
        return "stopped: the driver cancelled the run", _wire.CAUSE_STOPPED
    if driver_silent:
        return (
            f"stopped: heard nothing from the driver for {heartbeat_timeout_s:g} s "
            "(HorovodRunner heartbeat_timeout_s); the driver, or the network to it, is gone",
            _wire.CAUSE_LOST,
        )
    if not init_reached and waited_s > start_timeout_s:
        start = _engines.engine(engine).start_point
        return (
            f"did not reach {start} within {start_timeout_s:g} s "
            f"(HorovodRunner start_timeout_s): raise it if main does slow work before "
            f"{start}, or look for a rank stuck at start in its output",
            _wire.CAUSE_START_TIMEOUT,
        )
    return None


def reached_in_time(reached_after_s: float | None, start_timeout_s: float) -> bool:
    """Whether a rank reached its engine's start (``reached_after_s``, None: not yet) in time:
    a rank that got there between two polls, after the timeout, would otherwise pass."""
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
    """A signal or EX_TEMPFAIL (a TransientError) is transient; another exit status is not."""
    if returncode < 0:
        return _wire.CAUSE_SIGNAL
    return _wire.CAUSE_UNAVAILABLE if returncode == _wire.EXIT_TEMPFAIL else _wire.CAUSE_EXIT


# The last line of a Python traceback: the exception's (dotted) class name and its message.
_EXCEPTION_LINE = re.compile(r"^(?:[A-Za-z_]\w*\.)*([A-Za-z_]\w*(?:Error|Exception|Failed)): (.+)$")


def error_line(tail: Sequence[str], limit: int = 400) -> str | None:
    """The exception a rank's output ends with, for the error's first line; None if none."""
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


# TensorFlow's coordination service on workers whose heartbeats stopped: 2.21 lists a task line
# each after this, 2.15 writes "Task ... heartbeat timeout". A worker's task index is its rank.
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


# --- The stall watch ---


@dataclass(frozen=True)
class RankProgress:
    begun: int
    finished: int
    watch: bool
    changed: float  # driver's monotonic clock: when ``finished`` (or ``watch``) last changed


def stalled(progress: Mapping[int, RankProgress], now: float, timeout_s: float) -> list[int]:
    """The watched ranks whose finished-batch count has not changed for longer than timeout_s."""
    return sorted(r for r, p in progress.items() if p.watch and now - p.changed > timeout_s)


def culprits(progress: Mapping[int, RankProgress]) -> list[int]:
    """The ranks the others wait for: those watched ranks that have begun the fewest batches."""
    watched = {rank: p for rank, p in progress.items() if p.watch}
    fewest = min((p.begun for p in watched.values()), default=None)
    return sorted(rank for rank, p in watched.items() if p.begun == fewest)


def stall_report(
    progress: Mapping[int, RankProgress],
    timeout_s: float,
    stacks: Mapping[int, str],
    hosts: Mapping[int, str],
    now_wall: float,
) -> dict[str, Any]:
    """The failure report of a stalled run; its tail holds every rank's Python stacks."""
    blamed = culprits(progress)

    def who(rank: int) -> str:
        return f"rank {rank}" + (f" on {hosts[rank]}" if hosts.get(rank) else "")

    names = ", ".join(who(r) for r in blamed)
    what = f"{names} made no progress for over {timeout_s:g} s (HorovodRunner stall_timeout_s)"
    if len(blamed) == 1:
        what += f" after {progress[blamed[0]].finished} finished batch(es)"
        what += "; the other ranks wait for it" if len(progress) > 1 else ""
    else:
        what += ", all at the same batch"
    reason = (
        f"{what}. Look for a deadlock or stuck I/O in the stacks below; if the work is only "
        "slow between batches, raise stall_timeout_s"
    )
    report = _drivers_report(blamed[0] if blamed else -1, reason, now_wall, _wire.CAUSE_STALLED)
    for rank in sorted(set(progress) | set(stacks)):
        report["tail"].append(f"--- Python stacks of {who(rank)} ---")
        text = stacks.get(rank) or "(no stacks arrived from it)"
        report["tail"].extend(text.rstrip().splitlines())
    return report


class ProgressTracker:
    """The driver's view of every rank's progress, from the tasks' heartbeats."""

    def __init__(self, monotonic: Callable[[], float] = time.monotonic):
        self._monotonic = monotonic
        self._lock = threading.Lock()
        self._progress: dict[int, RankProgress] = {}
        self._hosts: dict[int, str] = {}

    def update(self, message: Any, hostname: str = "") -> None:
        """A heartbeat's ``progress`` (values from the network: keep only what fits)."""
        if not isinstance(message, dict):
            return
        try:
            rank, begun, finished = (int(message[k]) for k in ("rank", "begun", "finished"))
        except (KeyError, TypeError, ValueError):
            return
        watch = bool(message.get("watch", True))
        with self._lock:
            old = self._progress.get(rank)
            unchanged = old is not None and (old.finished, old.watch) == (finished, watch)
            changed = old.changed if unchanged else self._monotonic()
            self._progress[rank] = RankProgress(begun, finished, watch, changed)
            if hostname:
                self._hosts[rank] = hostname

    def stalled(self, timeout_s: float) -> list[int]:
        with self._lock:
            return stalled(self._progress, self._monotonic(), timeout_s)

    def snapshot(self) -> tuple[dict[int, RankProgress], dict[int, str]]:
        with self._lock:
            return dict(self._progress), dict(self._hosts)


# --- Liveness: who has gone silent ---


def is_overdue(last_heard: float, now: float, timeout_s: float) -> bool:
    """Exactly ``timeout_s`` is not overdue."""
    return now - last_heard > timeout_s


def overdue(last_heard: Mapping[Any, float], now: float, timeout_s: float) -> list:
    """The keys not heard from for longer than ``timeout_s``, the longest silent first."""
    late = [key for key, at in last_heard.items() if is_overdue(at, now, timeout_s)]
    return sorted(late, key=lambda key: last_heard[key])


def lost_task_report(
    *,
    partition: int | None,
    hostname: str,
    plan_hosts: Sequence[str] | None,
    timeout_s: float,
    last_heard_at: float,
) -> dict[str, Any]:
    """The failure report for a task silent for ``timeout_s``, shaped like a task's own so that
    ``root_failure`` weighs it; before the plan, the task is named by its partition."""
    rank, who = _who(partition, hostname, plan_hosts)
    reason = (
        f"{who} stopped answering: the driver heard nothing from it for {timeout_s:g} s "
        "(HorovodRunner heartbeat_timeout_s). Its host may be unreachable or frozen; if it "
        "was only busy, raise heartbeat_timeout_s"
    )
    return _drivers_report(rank, reason, last_heard_at)


def vanished_task_report(
    *, partition: int | None, hostname: str, plan_hosts: Sequence[str] | None, at: float
) -> dict[str, Any]:
    """For a task whose connection ended without its ``bye`` (it died): without it, the error
    would name a peer that broke off in its next collective."""
    rank, who = _who(partition, hostname, plan_hosts)
    reason = (
        f"{who} was lost: its task ended without a word (its Spark executor, worker or host "
        "died with it)"
    )
    return _drivers_report(rank, reason, at)


def driver_error_report(
    *,
    partition: int | None,
    hostname: str,
    plan_hosts: Sequence[str] | None,
    error: BaseException,
    at: float,
) -> dict[str, Any]:
    """For a task the driver stopped reading because handling a message raised ``error``: the
    run stops, but a "was lost" report would send its user to the executors' logs."""
    rank, who = _who(partition, hostname, plan_hosts)
    reason = (
        f"the driver stopped reading the messages of {who} when handling one raised "
        f"{type(error).__name__}: {error} (the traceback is in the driver's log; the task "
        "itself did not fail)"
    )
    return _drivers_report(rank, reason, at, _wire.CAUSE_DRIVER)


def _drivers_report(rank: int, reason: str, at: float, cause: str = _wire.CAUSE_LOST) -> dict:
    """The ``failed`` report for a task that cannot make its own (each cause here is transient)."""
    return dict(type=_wire.FAILED, rank=rank, reason=reason, tail=[], exited_at=at, cause=cause)


def _who(partition: int | None, hostname: str, plan_hosts: Sequence[str] | None):
    if plan_hosts and partition is not None and 0 <= partition < len(plan_hosts):
        slot = _engines.plan_ranks(plan_hosts)[partition]
        return slot.rank, _engines.describe_rank(slot.rank, hostname, slot.hostname)
    host = hostname or "an unknown host"
    rank = partition if partition is not None else -1
    who = f"the task of partition {partition} on {host}" if rank >= 0 else f"a task on {host}"
    return rank, who


@dataclass
class _Peer:
    partition: int | None
    hostname: str
    last_heard: float  # monotonic clock
    last_heard_at: float  # wall clock, for the report


class Tracker:
    """When each task (keyed by connection, hello to end) was last heard from; lost at most once."""

    def __init__(
        self, monotonic: Callable[[], float] = time.monotonic, wall: Callable[[], float] = time.time
    ):
        self._monotonic = monotonic
        self._wall = wall
        self._lock = threading.Lock()
        self._peers: dict[Hashable, _Peer] = {}
        self._plan_hosts: list[str] | None = None

    def join(self, key: Hashable, partition: Any, hostname: Any) -> None:
        """A task said hello (its values come from the network: keep only what fits)."""
        part = partition if isinstance(partition, int) and not isinstance(partition, bool) else None
        name = hostname[: _wire.MAX_HOSTNAME_CHARS] if isinstance(hostname, str) else ""
        with self._lock:
            self._peers[key] = _Peer(part, name, self._monotonic(), self._wall())

    def seen(self, key: Hashable) -> None:
        with self._lock:
            peer = self._peers.get(key)
            if peer is not None:
                peer.last_heard, peer.last_heard_at = self._monotonic(), self._wall()

    def leave(
        self, key: Hashable, vanished: bool = False, driver_error: BaseException | None = None
    ) -> dict[str, Any] | None:
        """A task's connection ended: its failure report if ``vanished`` or ``driver_error``."""
        with self._lock:
            peer = self._peers.pop(key, None)
            if not (vanished or driver_error) or peer is None:
                return None
            plan_hosts = self._plan_hosts
        where = {"partition": peer.partition, "hostname": peer.hostname, "plan_hosts": plan_hosts}
        if driver_error is not None:
            return driver_error_report(**where, error=driver_error, at=self._wall())
        return vanished_task_report(**where, at=self._wall())

    def plan(self, hosts: Sequence[str]) -> None:
        with self._lock:
            self._plan_hosts = list(hosts)

    def lost(self, timeout_s: float) -> list[dict[str, Any]]:
        """Failure reports for the tasks silent for longer than ``timeout_s``; each only once."""
        with self._lock:
            last = {k: p.last_heard for k, p in self._peers.items()}
            peers = [self._peers.pop(k) for k in overdue(last, self._monotonic(), timeout_s)]
            plan_hosts = self._plan_hosts
        return [
            lost_task_report(
                partition=p.partition,
                hostname=p.hostname,
                plan_hosts=plan_hosts,
                timeout_s=timeout_s,
                last_heard_at=p.last_heard_at,
            )
            for p in peers
        ]
