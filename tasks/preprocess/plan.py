"""The driver's plan, from the listing alone: the split, the checks that fail before any Spark
work, and which task decodes what into which row groups."""

from __future__ import annotations

import math
from dataclasses import dataclass

from hvdflow.tasks.images.listing import Item, Listing
from hvdflow.tasks.images.partitions import assign_partitions
from hvdflow.tasks.preprocess.config import DatasetManifest, PreprocessConfig
from hvdflow.tasks.preprocess.schema import image_shape
from hvdflow.tasks.preprocess.sources import listed_records
from hvdflow.tasks.preprocess.split import choose_boundaries, is_val, split_key
from hvdflow.tasks.preprocess.write import SPLITS, plan_row_groups, row_groups_for

# Decoded bytes per task: bigger inputs get more waves, so a failed task redoes a bounded share.
PARTITION_BYTES = 1 << 30


@dataclass(frozen=True)
class SplitPlan:
    label_index: dict[str, int]
    rules: dict  # label -> split.Boundary
    per_item: list[tuple[int, int]]  # (train, val) listed records of every listing item

    def totals(self) -> tuple[int, int]:
        return sum(t for t, _ in self.per_item), sum(v for _, v in self.per_item)


def plan_split(config: PreprocessConfig, listing: Listing, access) -> SplitPlan:
    """Which listed record goes to validation (split.py), and how many of each per item."""
    label_index = {name: i for i, name in enumerate(listing.labels)}
    records = listed_records(listing, label_index, access)
    rules = choose_boundaries(
        lambda: ((label, source) for _, label, source in records()),
        len(label_index),
        config.val_fraction,
        config.seed,
    )
    per_item = [[0, 0] for _ in listing.items]
    for i, label, source in records():
        per_item[i][is_val(rules, label, split_key(config.seed, source), source)] += 1
    return SplitPlan(label_index, rules, [tuple(counts) for counts in per_item])


def check_ranks(config: PreprocessConfig, train: int, val: int) -> None:
    """Every one of ``np`` ranks needs a non-empty row group of each split: at least ``np``
    listed records."""
    short = [
        (split, rows)
        for split, rows in (("train", train), ("val", val))
        if rows < config.np and (split == "train" or config.val_fraction > 0)
    ]
    if not short:
        return
    split, rows = short[0]
    fits = min(
        r for s, r in (("train", train), ("val", val)) if s == "train" or config.val_fraction
    )
    raise ValueError(
        f"np={config.np}: each rank needs at least one row group of the {split} split, but "
        f"{config.input!r} lists {train} train and {val} val rows "
        f"(val_fraction={config.val_fraction:g}), so {split} has {rows} < {config.np}: use "
        f"np <= {max(fits, 1)}, or add images"
        + (", or raise val_fraction" if split == "val" else "")
    )


def check_reused(config: PreprocessConfig, manifest: DatasetManifest) -> None:
    """A published dataset serves ``np`` ranks only if each split has a row group per rank."""
    for split, groups in (("train", manifest.train_row_groups), ("val", manifest.val_row_groups)):
        if split == "val" and not manifest.val_rows:
            continue
        if 0 < groups < config.np:  # 0: a manifest from before row groups were recorded
            raise ValueError(
                f"np={config.np}: dataset {manifest.path} has {groups} {split} row groups, "
                f"fewer than one per rank: use np <= {groups}, or add images"
            )


def check_listed(config: PreprocessConfig, listing: Listing) -> None:
    """Fail before any Spark work when the listing holds nothing to decode."""
    unusable = [item for item in listing.items if item.problem is not None]
    if len(unusable) < len(listing.items):
        return
    found = ""
    if unusable:
        first = unusable[0]
        found = f" (only unusable entries: {len(unusable)}, e.g. {first.source}: {first.problem})"
    raise ValueError(
        f"no images found in {config.input!r} ({config.input_format}){found}: expected one "
        "sub-folder per class with image files inside"
    )


def partition_count(slots: int, listing: Listing, config: PreprocessConfig) -> int:
    """One wave of tasks (``slots``), more only to keep each task's decoded share under
    PARTITION_BYTES: every task costs a round trip to a Python worker."""
    slots = max(1, slots)
    rows = sum(item.count for item in listing.items)
    nbytes = rows * math.prod(image_shape(config.image_size, config.color_mode))
    waves = max(1, math.ceil(nbytes / PARTITION_BYTES / slots))
    return max(1, min(len(listing.items), slots * waves))


@dataclass(frozen=True)
class PartitionPlan:
    """What each Spark task decodes and how its rows are cut into row groups."""

    items: list[list[Item]]  # partition -> the listing items it decodes
    sizes: dict[int, dict[str, list[int]]]  # partition -> split -> rows per row group


def plan_partitions(
    listing: Listing, split: SplitPlan, partitions: int, config: PreprocessConfig
) -> PartitionPlan:
    """Consecutive items to each partition (balanced by records), and each split's row groups
    (at least ``config.row_groups``, more for big splits) spread over the partitions."""
    assigned = assign_partitions([item.count for item in listing.items], partitions)
    by_partition: list[list[Item]] = [[] for _ in range(partitions)]
    counts = {name: [0] * partitions for name in SPLITS}
    for item, p, (train, val) in zip(listing.items, assigned, split.per_item, strict=True):
        by_partition[p].append(item)
        counts["train"][p] += train
        counts["val"][p] += val
    raw_bytes = math.prod(image_shape(config.image_size, config.color_mode))
    sizes: dict[int, dict[str, list[int]]] = {p: {} for p in range(partitions)}
    for name in SPLITS:
        rows = sum(counts[name])
        groups = row_groups_for(rows, rows * raw_bytes, config.row_groups)
        for p, part_sizes in enumerate(plan_row_groups(counts[name], groups)):
            sizes[p][name] = part_sizes
    return PartitionPlan(by_partition, sizes)
