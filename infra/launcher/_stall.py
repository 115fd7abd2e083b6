"""The stall watch: a rank that stops making progress after ``hvd.init()`` fails the run.

A deadlocked or stuck rank closes nothing and keeps its heartbeats going, and its peers wait for
it inside a collective: without a watch the run hangs until someone notices. Each task forwards
its rank's progress (batches begun and finished, ``rank_events.report_progress``) in its
heartbeats; the driver notes when each rank's count of finished batches last changed, on its own
clock, so hosts' clocks never matter. A rank watched and unchanged for longer than
``stall_timeout_s`` stalls the run.

Which rank to blame: when one rank stops, the others stop too, waiting for it in their next
collective, having begun one batch more than it. So the ranks that have begun the fewest batches
are named; if all have begun as many, all are. The decisions are pure functions, tested with exact
values; ``ProgressTracker`` is the driver's thread-safe bookkeeping around them.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from hvdflow.infra.launcher import _wire


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
    if not watched:
        return []
    fewest = min(p.begun for p in watched.values())
    return sorted(rank for rank, p in watched.items() if p.begun == fewest)


def stall_report(
    progress: Mapping[int, RankProgress],
    timeout_s: float,
    stacks: Mapping[int, str],
    hosts: Mapping[int, str],
    now_wall: float,
) -> dict[str, Any]:
    """The failure report of a stalled run, shaped like a task's ``failed`` report.

    Its tail holds every rank's Python stacks (``stacks``; a rank missing there is said to be).
    """
    blamed = culprits(progress)

    def who(rank: int) -> str:
        host = hosts.get(rank)
        return f"rank {rank}" + (f" on {host}" if host else "")

    names = ", ".join(who(r) for r in blamed)
    if len(blamed) == 1:
        p = progress[blamed[0]]
        what = (
            f"{names} made no progress for over {timeout_s:g} s (HorovodRunner stall_timeout_s) "
            f"after {p.finished} finished batch(es); the other ranks wait for it"
            if len(progress) > 1
            else f"{names} made no progress for over {timeout_s:g} s (HorovodRunner "
            f"stall_timeout_s) after {p.finished} finished batch(es)"
        )
    else:
        what = (
            f"{names} made no progress for over {timeout_s:g} s (HorovodRunner stall_timeout_s), "
            "all at the same batch"
        )
    reason = (
        f"{what}. Look for a deadlock or stuck I/O in the stacks below; if the work is only "
        "slow between batches, raise stall_timeout_s"
    )
    tail: list[str] = []
    for rank in sorted(set(progress) | set(stacks)):
        tail.append(f"--- Python stacks of {who(rank)} ---")
        tail.extend((stacks.get(rank) or "(no stacks arrived from it)").rstrip().splitlines())
    return {
        "type": _wire.FAILED,
        "rank": blamed[0] if blamed else -1,
        "reason": reason,
        "tail": tail,
        "exited_at": now_wall,
        "cause": _wire.CAUSE_STALLED,
    }


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
