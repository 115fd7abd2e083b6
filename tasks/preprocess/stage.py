"""The Spark stage: every planned partition decoded and written by one task, the tasks'
reports checked on the driver, then the attempt published or discarded."""

from __future__ import annotations

import heapq
import os
from collections import Counter
from contextlib import contextmanager
from dataclasses import dataclass

from hvdflow.infra.errors import DiskFullError, is_disk_full
from hvdflow.infra.spark_map import default_parallelism, map_slices
from hvdflow.infra.storage.files import Location
from hvdflow.infra.storage.uris import is_s3
from hvdflow.tasks.images.fetch import executor_errors
from hvdflow.tasks.images.quarantine import check_quality
from hvdflow.tasks.preprocess.decode import DecodePlan
from hvdflow.tasks.preprocess.plan import SplitPlan, partition_count, plan_partitions
from hvdflow.tasks.preprocess.publish import finish
from hvdflow.tasks.preprocess.write import SPLITS, WritePlan, write_partition


def run_stage(spark, config, listing, split: SplitPlan, fingerprint, version, attempt: str):
    """Decode and write every image in one Spark stage, check the tasks' reports, and publish
    the attempt; a failed check discards it."""
    partitions = partition_count(default_parallelism(spark), listing, config)
    planned_items = plan_partitions(listing, split, partitions, config)
    plan = WritePlan(
        decode=DecodePlan(
            image_size=tuple(config.image_size),
            color_mode=config.color_mode,
            max_pixels=config.max_pixels,
            seed=config.seed,
            label_index=split.label_index,
            root=listing.root,
            access=version.access if is_s3(listing.root) else None,
            encoding=config.image_encoding,
        ),
        attempt_url=version.join(attempt),
        access=version.access,
        rules=split.rules,
        sizes=planned_items.sizes,
    )

    def write(planned):
        return write_partition(planned, plan)

    # One (partition, items) pair per task: small pickled values, no image through the JVM.
    planned = list(enumerate(planned_items.items))
    with executor_errors(), _disk_full_said(version, attempt):
        written = map_slices(
            spark,
            planned,
            write,
            f"hvdflow preprocess: decoding and writing "
            f"{sum(i.count for i in listing.items)} images",
        )
    try:
        report = Report.of(written)
        check_quality(config, report.good, report.bad, report.reasons, report.examples)
        report.check_row_groups(config)
    except ValueError:
        discard(version, attempt)  # every task has ended: nothing writes there any more
        raise
    return finish(config, fingerprint, version, attempt, split.label_index, report)


@dataclass(frozen=True)
class Report:
    """What the write tasks reported: part files, unusable inputs by kind, a few examples."""

    files: dict[str, dict[str, int]]  # split -> part file -> row groups
    rows: dict[str, int]  # split -> rows
    quarantine_parts: list[str]
    bad: int
    reasons: Counter
    examples: list[tuple[str, str]]

    @classmethod
    def of(cls, written) -> Report:

        files: dict[str, dict[str, int]] = {name: {} for name in SPLITS}
        rows = dict.fromkeys(SPLITS, 0)
        parts, reasons, examples, bad = [], Counter(), [], 0
        for row in written:
            if row.kind in files:
                files[row.kind][row.name] = row.row_groups
                rows[row.kind] += row.rows
            elif row.kind == "quarantine":
                parts.append(row.name)
                bad += row.rows
            elif row.kind == "reason":
                reasons[row.name] += row.rows
            else:
                examples.append(tuple(row.name.split("\0", 1)))
        return cls(files, rows, sorted(parts), bad, reasons, heapq.nsmallest(3, examples))

    @property
    def good(self) -> int:
        return sum(self.rows.values())

    def check_row_groups(self, config) -> None:
        """Unusable inputs can leave a split with fewer non-empty row groups than ranks."""
        for name, rows in self.rows.items():
            groups = sum(self.files[name].values())
            if groups < config.np and (name == "train" or config.val_fraction > 0):
                raise ValueError(
                    f"np={config.np}: after quarantining {self.bad} unusable "
                    f"inputs the {name} split has {rows} rows in {groups} row groups, fewer "
                    f"than one per rank: use np <= {max(groups, 1)}, or fix or add images"
                )


@contextmanager
def _disk_full_said(version: Location, attempt: str):
    """A full disk fails the stage as a DiskFullError; the attempt's folder is removed."""
    try:
        yield
    except Exception as e:
        if not is_disk_full(e):
            raise
        discard(version, attempt)  # the job has failed: its tasks write no more
        raise DiskFullError(
            f"preprocessing ran out of disk space writing the dataset to {version.join(attempt)}: "
            "no space left on device. Nothing was published (no manifest names this attempt, "
            "and its files were removed). Free space on that disk, or set data.output to a "
            "folder on a larger one; the next run makes the dataset again"
        ) from e


def discard(version: Location, attempt: str) -> None:
    try:
        version.remove_tree(attempt)
        if not is_s3(version.base):
            os.rmdir(version.base)  # only if empty: nothing else was there
    except OSError:
        pass
