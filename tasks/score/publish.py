"""Where scoring output goes, and how it becomes visible all at once.

Layout of an output folder (local, every executor sees it, or an ``s3://`` prefix)::

    manifest.json                       written last: the attempt that holds the predictions,
                                        the model version, the input, counts per class
    attempt-<UTC time>-<random>/
        predictions/part-NNNNN.parquet  source, class_name, class_index, probability; written
        predictions/_SUCCESS              by the executors, the marker by the driver after them
        quarantine.csv                  source,reason of every input that could not be scored

Readers open only the ``predictions_url`` manifest.json names, written after every file of its
attempt is complete. Publishing removes the attempt the previous manifest named, and unnamed
attempts older than a day (``hvdflow.infra.storage.attempts``).
"""

from __future__ import annotations

import json
import logging
import time

from hvdflow.infra.storage.attempts import MANIFEST, removable_attempts
from hvdflow.infra.storage.files import Location

logger = logging.getLogger(__name__)

SUCCESS = "_SUCCESS"


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
