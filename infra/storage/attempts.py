"""Attempt folders: how a run's output is named while it writes, and which ones may go.

A dataset version (preprocessing) and a scoring output are published the same way: every run
writes into a folder of its own, ``attempt-<UTC time>-<random>``, and a manifest written last
names the one that counts. Publishing removes the attempt the previous manifest named, and
unnamed attempts older than STALE_ATTEMPT_S (left by runs that died); a younger one may belong
to a run still writing (two scheduled runs started together), and is left alone.
"""

from __future__ import annotations

import calendar
import time
import uuid

ATTEMPT_PREFIX = "attempt-"
ATTEMPT_TIME_FORMAT = "%Y%m%dT%H%M%SZ"
STALE_ATTEMPT_S = 24 * 3600
# The manifest written last, beside the attempt folders: it names the attempt that counts.
MANIFEST = "manifest.json"


def new_attempt(now: float | None = None) -> str:
    stamp = time.strftime(ATTEMPT_TIME_FORMAT, time.gmtime(now))
    return f"{ATTEMPT_PREFIX}{stamp}-{uuid.uuid4().hex[:8]}"


def attempt_time(name: str) -> float | None:
    """When an attempt started (seconds since the epoch), from its name; None if not one."""
    if not name.startswith(ATTEMPT_PREFIX):
        return None
    stamp = name[len(ATTEMPT_PREFIX) :].split("-", 1)[0]
    try:
        return float(calendar.timegm(time.strptime(stamp, ATTEMPT_TIME_FORMAT)))
    except ValueError:
        return None


def removable_attempts(names: list[str], keep: str, previous: str | None, now: float) -> list[str]:
    """Attempts to remove once ``keep`` is published: the one ``previous`` named, and stale ones."""
    found = []
    for name in names:
        started = attempt_time(name)
        if started is None or name == keep:
            continue
        if name == previous or now - started > STALE_ATTEMPT_S:
            found.append(name)
    return found
