"""Where scoring output goes, and how it becomes visible all at once.

Layout of an output folder (local, every executor sees it, or an ``s3://`` prefix)::

    manifest.json                       written last: the attempt that holds the predictions,
                                        the model version, the input, counts per class
    attempt-<UTC time>-<random>/
        predictions/part-NNNNN.parquet  source, class_name, class_index, probability; written
        predictions/_SUCCESS              by the executors, the marker by the driver after them
        quarantine.csv                  source,reason of every input that could not be scored

Readers open the ``predictions_url`` that manifest.json names, and nothing else: it is written
(one rename, or one object PUT) only after every file of its attempt is complete, so a run that
dies leaves an attempt no manifest names. Publishing removes the attempt the previous manifest
named, and unnamed attempts older than STALE_ATTEMPT_S (left by runs that died); a younger one
may belong to a run still writing.
"""

from __future__ import annotations

import calendar
import json
import logging
import time
import uuid

from hvdflow.infra.storage.files import Location

logger = logging.getLogger(__name__)

MANIFEST = "manifest.json"
SUCCESS = "_SUCCESS"
ATTEMPT_PREFIX = "attempt-"
ATTEMPT_TIME_FORMAT = "%Y%m%dT%H%M%SZ"
STALE_ATTEMPT_S = 24 * 3600


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


def read_manifest(location: Location) -> dict | None:
    data = location.read_bytes(MANIFEST)
    return json.loads(data) if data is not None else None


def publish(location: Location, attempt: str, record: dict) -> None:
    """Mark the predictions complete, write the manifest (the moment they become the output),
    then remove what it replaces."""
    previous = read_manifest(location)
    location.write_bytes(f"{attempt}/predictions/{SUCCESS}", b"")
    location.write_bytes(MANIFEST, json.dumps(record, indent=2).encode())
    old = previous.get("attempt") if previous else None
    for name in removable_attempts(location.subfolders(), attempt, old, time.time()):
        try:
            location.remove_tree(name)
            logger.info("removed %s", location.join(name))
        except Exception as e:  # no manifest names it: only clutter
            logger.warning("could not remove %s: %s", location.join(name), e)


def discard(location: Location, attempt: str) -> None:
    try:
        location.remove_tree(attempt)
    except OSError:
        pass
