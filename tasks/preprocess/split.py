"""The train/val split: stratified by class, chosen by a seeded hash, decided before decoding.

Every class keeps ``round(n * val_fraction)`` of its ``n`` listed inputs for validation: the
ones whose ``sha256(f"{seed}:{source}")`` is smallest. An unusable input is quarantined from
the split it was chosen for; a usable image never changes split because another is corrupt.

The driver decides it from the listing in memory that does not grow with the rows: one pass
makes a histogram of keys per class (BUCKETS per class), which gives the bucket holding each
class's last validation record; a second keeps only the keys in those buckets, which give that
record exactly: the class's ``Boundary``. Executors then put a record in validation when its
(key, source) is at or below its Boundary. ``stratified_val_sources`` is the same rule over an
in-memory list, the reference the two-pass version is tested against.
"""

from __future__ import annotations

import hashlib
from collections import defaultdict
from dataclasses import dataclass

import numpy as np

KEY_BITS = 63  # non-negative in a signed 64-bit column
BUCKET_BITS = 8
BUCKETS = 1 << BUCKET_BITS
_SHIFT = KEY_BITS - BUCKET_BITS


def split_key(seed: int, source: str) -> int:
    """The first 63 bits of sha256(f"{seed}:{source}"): orders like the full hex digest."""
    digest = hashlib.sha256(f"{seed}:{source}".encode()).digest()
    return int.from_bytes(digest[:8], "big") >> (64 - KEY_BITS)


def val_count(rows: int, val_fraction: float) -> int:
    """How many of a class's ``rows`` listed inputs go to validation."""
    return round(rows * val_fraction)


@dataclass(frozen=True)
class Boundary:
    """A class's last validation record: records at or below it, in (key, source) order, are
    validation."""

    key: int
    source: str


def boundary_buckets(histogram: np.ndarray, wanted: list[int]) -> tuple[list[int], list[int]]:
    """For each class (a row of ``histogram``, counts per bucket): the bucket holding its
    ``wanted``-th smallest key (-1 when it wants none), and how many keys lie in lower buckets."""
    buckets, below = [], []
    for counts, k in zip(histogram, wanted, strict=True):
        if k <= 0:
            buckets.append(-1)
            below.append(0)
            continue
        cumulative = np.cumsum(counts)
        bucket = int(np.searchsorted(cumulative, k))  # first bucket where cumulative >= k
        buckets.append(bucket)
        below.append(int(cumulative[bucket - 1]) if bucket else 0)
    return buckets, below


def boundaries(
    candidates: dict[int, list[tuple[int, str]]],
    buckets: list[int],
    below: list[int],
    wanted: list[int],
) -> dict[int, Boundary]:
    """Each class's Boundary from the (key, source) pairs inside its boundary bucket."""
    result = {}
    for label, bucket in enumerate(buckets):
        if bucket < 0:
            continue
        inside = sorted(candidates.get(label, []))
        position = wanted[label] - below[label] - 1
        if not 0 <= position < len(inside):
            raise RuntimeError(
                f"class {label}: expected its validation boundary among {len(inside)} keys of "
                f"bucket {bucket} (position {position}): the listing changed between two passes"
            )
        key, source = inside[position]
        result[label] = Boundary(key, source)
    return result


def choose_boundaries(records, classes: int, val_fraction: float, seed: int) -> dict[int, Boundary]:
    """Each class's Boundary from ``records()``: an iterable of (label, source), read twice."""
    histogram = np.zeros((classes, BUCKETS), dtype=np.int64)
    for label, source in records():
        histogram[label, split_key(seed, source) >> _SHIFT] += 1
    wanted = [val_count(int(n), val_fraction) for n in histogram.sum(axis=1)]
    buckets, below = boundary_buckets(histogram, wanted)
    inside: dict[int, list[tuple[int, str]]] = {}
    for label, source in records():
        key = split_key(seed, source)
        if key >> _SHIFT == buckets[label]:
            inside.setdefault(label, []).append((key, source))
    return boundaries(inside, buckets, below, wanted)


def is_val(rules: dict[int, Boundary], label: int, key: int, source: str) -> bool:
    rule = rules.get(label)
    return rule is not None and (key, source) <= (rule.key, rule.source)


def stratified_val_sources(
    good: list[tuple[str, str]], val_fraction: float, seed: int
) -> frozenset[str]:
    """The validation share of every class, chosen by a seeded hash: same input, same split."""
    by_label: dict[str, list[str]] = defaultdict(list)
    for source, label in good:
        by_label[label].append(source)
    chosen: set[str] = set()
    for members in by_label.values():
        members.sort(key=lambda s: (split_key(seed, s), s))
        chosen.update(members[: val_count(len(members), val_fraction)])
    return frozenset(chosen)
