"""Liveness of the task <-> driver channel: who has gone silent for too long.

A cut cable or a frozen host closes no connection: the other side just stops hearing anything.
So each side notes when it last heard from the other (any message counts; tasks send a heartbeat
every ``_wire.HEARTBEAT_INTERVAL_S`` and the driver answers it) and gives the other up after
``heartbeat_timeout_s``. The decisions are pure functions over times, tested with exact values;
``Tracker`` is the driver's thread-safe bookkeeping around them.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from hvdflow.infra.launcher import _wire
from hvdflow.infra.launcher._placement import describe_rank, plan_ranks


def is_overdue(last_heard: float, now: float, timeout_s: float) -> bool:
    """Whether nothing was heard for longer than ``timeout_s`` (exactly ``timeout_s`` is not)."""
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
    """The failure report for a task the driver has not heard from for ``timeout_s``.

    Shaped like a task's own ``failed`` report (``rank``, ``reason``, ``tail``, ``exited_at``),
    so that ``root_failure`` weighs it with the others; the silence began at ``last_heard_at``
    (wall-clock seconds). Before the plan is known the task has no rank yet: it is named by its
    partition.
    """
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
    """The failure report for a task whose connection ended without its ``bye``: the task
    process died (its executor, Spark worker or host with it), so nobody reports its rank.

    Without it, the error would name a peer that broke off in its next collective instead.
    """
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
    """The failure report for a task whose messages the driver stopped reading because it raised
    ``error`` on one of them: a fault of the driver process, or a message it could not handle.
    Either way the task's connection is no longer read, so the run stops; but the task did not
    vanish, and a "was lost" report would send its user to the executors' logs."""
    rank, who = _who(partition, hostname, plan_hosts)
    reason = (
        f"the driver stopped reading the messages of {who} when handling one raised "
        f"{type(error).__name__}: {error} (the traceback is in the driver's log; the task "
        "itself did not fail)"
    )
    return _drivers_report(rank, reason, at, _wire.CAUSE_DRIVER)


def _drivers_report(
    rank: int, reason: str, at: float, cause: str = _wire.CAUSE_LOST
) -> dict[str, Any]:
    """A ``failed`` report the driver makes for a task that cannot make its own: lost by default,
    or ``cause`` (every cause used here is transient)."""
    return {
        "type": _wire.FAILED,
        "rank": rank,
        "reason": reason,
        "tail": [],
        "exited_at": at,
        "cause": cause,
    }


def _who(partition: int | None, hostname: str, plan_hosts: Sequence[str] | None):
    """A task's rank and how errors name it; before the plan, by its partition."""
    if plan_hosts and partition is not None and 0 <= partition < len(plan_hosts):
        slot = plan_ranks(plan_hosts)[partition]
        return slot.rank, describe_rank(slot.rank, hostname, slot.hostname)
    host = hostname or "an unknown host"
    rank = partition if partition is not None else -1
    return rank, (
        f"the task of partition {partition} on {host}" if rank >= 0 else f"a task on {host}"
    )


@dataclass
class _Peer:
    partition: int | None
    hostname: str
    last_heard: float  # monotonic clock
    last_heard_at: float  # wall clock, for the report


class Tracker:
    """The driver's view of its tasks: when each was last heard from, and who it is.

    Keys are the channel's connections. A task is tracked from its hello until its connection
    ends, and reported lost at most once.
    """

    def __init__(
        self,
        monotonic: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
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
        """A task's connection ended; ``vanished``: without its bye; ``driver_error``: because
        the driver raised it while reading. Then the failure report, if it failed."""
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
        """The task hosts the run was planned with: they turn partitions into ranks."""
        with self._lock:
            self._plan_hosts = list(hosts)

    def lost(self, timeout_s: float) -> list[dict[str, Any]]:
        """Failure reports for the tasks silent for longer than ``timeout_s``; each only once."""
        with self._lock:
            keys = overdue(
                {k: p.last_heard for k, p in self._peers.items()}, self._monotonic(), timeout_s
            )
            peers = [self._peers.pop(k) for k in keys]
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
