"""The quarantine: every input that could not be used, with its reason. Each task writes
``quarantine/part-NNNNN.csv``; the driver merges them into one sorted ``quarantine.csv`` and fails
the run above ``max_bad_fraction``."""

from __future__ import annotations

import csv
import heapq
import io
import logging
from collections import Counter

from hvdflow.infra.storage.files import Location, open_for_write
from hvdflow.infra.storage.uris import join
from hvdflow.tasks.images.partitions import part_name

logger = logging.getLogger(__name__)

QUARANTINE_HEADER = ("source", "reason")


def check_quality(config, good: int, bad: int, reasons: Counter, examples: list) -> None:
    """Fail when no input, or more than ``config.max_bad_fraction`` of them, is a usable image
    (``examples``: the first (source, reason) pairs, sorted)."""
    total = good + bad
    if good == 0:
        raise ValueError(
            f"none of the {total} inputs in {config.input!r} is a usable image (most common "
            f"reasons: {reasons.most_common(3)}); check the path and the input_format"
        )
    if bad and bad / total > config.max_bad_fraction:
        shown = "; ".join(f"{s}: {r}" for s, r in examples[:3])
        raise ValueError(
            f"{bad} of {total} inputs ({bad / total:.0%}) are unusable, above "
            f"max_bad_fraction={config.max_bad_fraction:g}; e.g. {shown}. Fix the inputs or "
            "raise max_bad_fraction"
        )
    if bad:
        logger.warning("quarantined %d of %d inputs (see quarantine.csv)", bad, total)


def write_quarantine_part(attempt_url: str, partition: int, bad, access, client) -> str:
    """A partition's unusable inputs, sorted (source, reason) pairs, as the attempt's
    ``quarantine/part-NNNNN.csv``; returns the file's name (for write_quarantine)."""
    name = part_name(partition, "csv")
    with open_for_write(join(attempt_url, "quarantine", name), access, client) as f:
        f.write(_csv_bytes(bad))
    return name


def _csv_bytes(rows) -> bytes:
    text = io.StringIO()
    writer = csv.writer(text)
    writer.writerow(QUARANTINE_HEADER)
    writer.writerows(rows)
    return text.getvalue().encode()


def write_quarantine(attempt_dir: Location, parts: list[str]) -> str:
    """The executors' quarantine parts merged into the attempt's one sorted quarantine.csv
    (only its header when there are none), the parts removed; returns its URL."""
    if not parts:
        return attempt_dir.write_bytes(
            "quarantine.csv", (",".join(QUARANTINE_HEADER) + "\r\n").encode()
        )
    _merge_quarantine(attempt_dir, parts, "quarantine.csv")
    try:
        attempt_dir.remove_tree("quarantine")
    except Exception as e:  # the merged report exists; the parts are only clutter
        logger.warning("could not remove %s: %s", attempt_dir.join("quarantine"), e)
    return attempt_dir.join("quarantine.csv")


def _merge_quarantine(location, parts: list[str], name: str) -> None:
    """The executors' quarantine parts (each sorted) merged into one sorted CSV, streamed."""

    def rows(part: str):
        lines = location.iter_lines(f"quarantine/{part}")
        reader = csv.reader(lines)
        next(reader, None)  # header
        yield from (tuple(row) for row in reader)

    with location.open_for_write(name) as f:
        text = io.TextIOWrapper(f, encoding="utf-8", newline="")
        writer = csv.writer(text)
        writer.writerow(QUARANTINE_HEADER)
        for row in heapq.merge(*(rows(p) for p in parts)):
            writer.writerow(row)
        text.flush()
        text.detach()
