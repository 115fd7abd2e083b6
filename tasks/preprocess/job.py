"""Step 1: raw images to Petastorm Parquet with PySpark (path in, manifest out).

Layout of one dataset version (``<output>/<fingerprint[:16]>/``, a local folder every executor
sees, or an ``s3://`` prefix)::

    manifest.json                   written last: the attempt that is the dataset, its URLs
    attempt-<UTC time>-<random>/    everything one attempt wrote
        train/part-NNNNN.parquet    Petastorm dataset (image, label, source, split), written by
        train/_common_metadata        the executors; its metadata by the driver, after them
        val/...                     the same for validation
        labels.json                 class name -> label index
        quarantine.csv              source,reason for every input that was left out (merged
                                    from the executors' quarantine/part-NNNNN.csv)

Publication is atomic: readers open the URLs in ``manifest.json`` and nothing else, and it is
written (one rename, or one object PUT) only after every file of its attempt is complete. A run
that dies leaves an attempt folder no manifest names; the next run writes a new attempt from
scratch, so no file of a failed attempt is ever read, and removes stale attempts once its own
is published. The same fingerprint reuses the published version without touching Spark.

The driver lists the inputs (names, sizes, versions; no request per object), decides the split
from the listing (split.py) and plans every partition's row groups; one Spark stage decodes
every image once and writes it in Arrow row groups (write.py). The driver holds the listing and
numbers per class and per partition, never an image or a row: no shuffle, no collect of the
records, and image bytes never pass through the JVM. (The stage is a plain ``mapPartitions``
over the planned items, not ``mapInArrow``: with nothing but paths going in and a few tuples
coming out, a DataFrame would only add query planning and Arrow conversions in the JVM, which
measured 10-13% slower on bench/preprocess_throughput.py.)
"""

from __future__ import annotations

import json
import logging
import math
import os
import time
import uuid
from collections import Counter
from dataclasses import asdict, dataclass
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from hvdflow.tasks.preprocess import sources
from hvdflow.tasks.preprocess.storage import Location, S3Access, dataset_url, is_s3, join

logger = logging.getLogger(__name__)

MANIFEST = "manifest.json"
# The reports of a published attempt, beside its train/ and val/ splits.
ATTEMPT_FILES = ("labels.json", "quarantine.csv")
ATTEMPT_PREFIX = "attempt-"
# Decoded image bytes (raw) per task: bigger inputs get more waves of tasks, so that a failed
# task redoes a bounded share (a task streams its rows: its memory does not depend on this).
PARTITION_BYTES = 1 << 30


class PreprocessConfig(BaseModel):
    """What to read, how to turn it into training images, and where to write them."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    input: str  # a folder every executor sees, or s3://bucket/prefix/
    input_format: Literal["folders", "mnist_idx", "digits"] = "folders"
    output: str = "data/datasets"
    image_size: tuple[int, int] = (28, 28)  # (height, width)
    color_mode: Literal["L", "RGB"] = "L"
    val_fraction: float = Field(default=0.2, ge=0.0, lt=1.0)
    seed: int = 0
    max_pixels: int = Field(default=50_000_000, gt=0)
    max_bad_fraction: float = Field(default=0.1, ge=0.0, le=1.0)
    # Ranks the dataset is sharded for: each split gets at least this many non-empty row groups,
    # so every one of up to `shards` ranks reads data (the flow passes max(8, |np|)).
    shards: int = Field(default=8, ge=1)

    @model_validator(mode="after")
    def _digits_are_local(self) -> PreprocessConfig:
        if self.input_format == "digits" and is_s3(self.input):
            raise ValueError(
                f"input {self.input!r}: input_format 'digits' writes the bundled digits to a "
                "local folder; give a folder path, or 'folders'/'mnist_idx' for images in a bucket"
            )
        return self

    def params(self) -> dict:
        """What decides the content besides the input files: part of the fingerprint."""
        values = self.model_dump(exclude={"input", "output", "shards"})
        # Under the name it had when it counted files per split: the default (8) keeps the
        # fingerprints, and so the datasets, that earlier versions wrote.
        values["files_per_split"] = self.shards
        return values


@dataclass(frozen=True)
class DatasetManifest:
    # The dataset's folder, holding train/, val/, labels.json and quarantine.csv (a local path
    # or s3:// URI): the published attempt, inside the version folder <output>/<fingerprint[:16]>
    # that holds manifest.json.
    path: str
    fingerprint: str
    train_url: str
    val_url: str
    train_rows: int
    val_rows: int
    quarantined: int
    label_map: dict[str, int]
    image_shape: tuple[int, ...]
    quarantine_path: str
    attempt: str = ""  # the attempt folder inside `path` whose files are the dataset
    train_row_groups: int = 0
    val_row_groups: int = 0
    reused: bool = False

    @property
    def num_classes(self) -> int:
        return len(self.label_map)


def list_inputs(config: PreprocessConfig, access: S3Access | None = None) -> sources.Listing:
    if is_s3(config.input):
        access = access or S3Access.from_env()
        if config.input_format == "mnist_idx":
            return sources.list_mnist_idx(config.input, access)
        return sources.list_s3_class_folders(config.input, access)
    if config.input_format == "mnist_idx":
        return sources.list_mnist_idx(config.input)
    root = config.input
    if config.input_format == "digits":
        root = sources.write_digits_tree(config.input)
    return sources.list_class_folders(root)


def preprocess_images(spark, config: PreprocessConfig, store=None) -> DatasetManifest:
    """Decode, convert and resize the input images into a train/val Petastorm dataset.

    ``store`` (an ObjectStore) gives the endpoint for ``s3://`` input and output; by default
    the AWS variables do. Fails before any Spark work when the inputs cannot give each of
    ``config.shards`` ranks a row group of each split.
    """
    uses_s3 = is_s3(config.input) or is_s3(config.output)
    access = S3Access.from_env(store) if uses_s3 else None
    listing = list_inputs(config, access)
    _check_listed(config, listing)
    fingerprint = sources.fingerprint(listing, config.params())
    version = Location(join(config.output, fingerprint[:16]), access)
    existing = read_manifest(version)
    if existing is not None:
        logger.info(
            "dataset %s is up to date (fingerprint %s): reusing", version.base, fingerprint[:16]
        )
        return existing
    split = plan_split(config, listing, access)
    check_shards(config, *split.totals())

    started = time.monotonic()
    attempt = (
        f"{ATTEMPT_PREFIX}{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}-{uuid.uuid4().hex[:8]}"
    )
    manifest = _build(spark, config, listing, split, fingerprint, version, attempt)
    logger.info(
        "preprocessed %d images into %s in %.1f s (%d train, %d val, %d quarantined)",
        manifest.train_rows + manifest.val_rows,
        manifest.path,
        time.monotonic() - started,
        manifest.train_rows,
        manifest.val_rows,
        manifest.quarantined,
    )
    return manifest


# --- the split, from the listing --------------------------------------------------------------


@dataclass(frozen=True)
class SplitPlan:
    label_index: dict[str, int]
    rules: dict  # label -> split.Boundary
    per_item: list[tuple[int, int]]  # (train, val) listed records of every listing item

    def totals(self) -> tuple[int, int]:
        return sum(t for t, _ in self.per_item), sum(v for _, v in self.per_item)


def plan_split(config: PreprocessConfig, listing: sources.Listing, access) -> SplitPlan:
    """Which listed record goes to validation (split.py), and how many of each per item."""
    from hvdflow.tasks.preprocess.split import choose_boundaries, is_val, split_key

    label_index = {name: i for i, name in enumerate(listing.labels)}
    records = sources.listed_records(listing, label_index, access)
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


# --- checks before and after decoding -------------------------------------------------------


def check_shards(config: PreprocessConfig, train: int, val: int) -> None:
    """Every one of ``shards`` ranks needs a non-empty row group of each split to read: a split
    needs at least ``shards`` listed records (one row group can hold no fewer than one)."""
    short = [
        (split, rows)
        for split, rows in (("train", train), ("val", val))
        if rows < config.shards and (split == "train" or config.val_fraction > 0)
    ]
    if not short:
        return
    split, rows = short[0]
    fits = min(
        r for s, r in (("train", train), ("val", val)) if s == "train" or config.val_fraction
    )
    raise ValueError(
        f"np={config.shards} (shards): each rank needs at least one row group of the {split} "
        f"split, but {config.input!r} lists {train} train and {val} val rows "
        f"(val_fraction={config.val_fraction:g}), so {split} has {rows} < {config.shards}: use "
        f"np <= {max(fits, 1)}, or add images"
        + (", or raise val_fraction" if split == "val" else "")
    )


def _check_listed(config: PreprocessConfig, listing: sources.Listing) -> None:
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


# --- the Spark job ---------------------------------------------------------------------------


def _partitions(sc, listing, config) -> int:
    """One wave of tasks (a multiple of the task slots), more only to keep each task's share of
    decoded images under PARTITION_BYTES. Every task costs a round trip to a Python worker, so
    more tasks than slots cost time and buy nothing; row groups are planned apart from them."""
    from hvdflow.tasks.preprocess.schema import image_shape

    slots = max(1, sc.defaultParallelism)
    rows = sum(item.count for item in listing.items)
    nbytes = rows * math.prod(image_shape(config.image_size, config.color_mode))
    waves = max(1, math.ceil(nbytes / PARTITION_BYTES / slots))
    return max(1, min(len(listing.items), slots * waves))


def assign_partitions(weights: list[int], partitions: int) -> list[int]:
    """Consecutive items to each partition, balanced by weight (records per item)."""
    total = max(1, sum(weights))
    assigned, before = [], 0
    for weight in weights:
        assigned.append(min(partitions - 1, before * partitions // total))
        before += weight
    return assigned


def _build(spark, config, listing, split: SplitPlan, fingerprint, version, attempt: str):
    from hvdflow.tasks.preprocess.decode import DecodePlan, executor_errors
    from hvdflow.tasks.preprocess.schema import image_shape
    from hvdflow.tasks.preprocess.write import (
        SPLITS,
        WritePlan,
        plan_row_groups,
        row_groups_for,
        write_partition,
    )

    sc = spark.sparkContext
    partitions = _partitions(sc, listing, config)
    assigned = assign_partitions([item.count for item in listing.items], partitions)
    by_partition: list[list[sources.Item]] = [[] for _ in range(partitions)]
    counts = {name: [0] * partitions for name in SPLITS}
    for item, p, (train, val) in zip(listing.items, assigned, split.per_item, strict=True):
        by_partition[p].append(item)
        counts["train"][p] += train
        counts["val"][p] += val
    raw_bytes = math.prod(image_shape(config.image_size, config.color_mode))
    sizes: dict[int, dict[str, list[int]]] = {p: {} for p in range(partitions)}
    for name in SPLITS:
        rows = sum(counts[name])
        groups = row_groups_for(rows, rows * raw_bytes, config.shards)
        for p, part_sizes in enumerate(plan_row_groups(counts[name], groups)):
            sizes[p][name] = part_sizes
    plan = WritePlan(
        decode=DecodePlan(
            image_size=tuple(config.image_size),
            color_mode=config.color_mode,
            max_pixels=config.max_pixels,
            seed=config.seed,
            label_index=split.label_index,
            root=listing.root,
            access=version.access if is_s3(listing.root) else None,
        ),
        attempt_url=version.join(attempt),
        access=version.access,
        rules=split.rules,
        sizes=sizes,
    )

    def write(planned):
        return write_partition(planned, plan)

    # One (partition, items) pair per slice: every task gets the items planned for it. The
    # items travel as small pickled values; decoded images never pass through the JVM.
    planned = [(p, items) for p, items in enumerate(by_partition)]
    sc.setJobDescription(
        f"hvdflow preprocess: decoding and writing {sum(i.count for i in listing.items)} images"
    )
    try:
        with executor_errors():
            written = sc.parallelize(planned, partitions).mapPartitions(write).collect()
    finally:
        sc.setJobDescription(None)
    try:
        report = _Report.of(written)
        check_quality(config, report.good, report.bad, report.reasons, report.examples)
        report.check_row_groups(config)
    except ValueError:
        _discard(version, attempt)  # every task has ended: nothing writes there any more
        raise
    return _finish(config, fingerprint, version, attempt, split.label_index, report)


@dataclass(frozen=True)
class _Report:
    """What the write tasks reported: part files, unusable inputs by kind, a few examples."""

    files: dict[str, dict[str, int]]  # split -> part file -> row groups
    rows: dict[str, int]  # split -> rows
    quarantine_parts: list[str]
    bad: int
    reasons: Counter
    examples: list[tuple[str, str]]

    @classmethod
    def of(cls, written) -> _Report:
        import heapq

        from hvdflow.tasks.preprocess.write import SPLITS

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
            if groups < config.shards and (name == "train" or config.val_fraction > 0):
                raise ValueError(
                    f"np={config.shards} (shards): after quarantining {self.bad} unusable "
                    f"inputs the {name} split has {rows} rows in {groups} row groups, fewer "
                    f"than one per rank: use np <= {max(groups, 1)}, or fix or add images"
                )


def _discard(version: Location, attempt: str) -> None:
    try:
        version.remove_tree(attempt)
        if not is_s3(version.base):
            os.rmdir(version.base)  # only if empty: nothing else was there
    except OSError:
        pass


def _finish(config, fingerprint, version, attempt, label_index, report: _Report):
    """On the driver, once the part files exist: Petastorm metadata, reports, the manifest."""
    from hvdflow.tasks.preprocess.schema import image_schema, image_shape
    from hvdflow.tasks.preprocess.write import (
        SPLITS,
        arrow_schema,
        write_empty_split,
        write_petastorm_metadata,
        write_quarantine,
    )

    attempt_url = version.join(attempt)
    files, done = report.files, report.rows
    unischema = image_schema(config.image_size, config.color_mode)
    row_groups = {}
    for split in SPLITS:
        split_url = join(attempt_url, split)
        if not files[split]:  # val_fraction=0: an empty split that still opens
            files[split][write_empty_split(split_url, arrow_schema(), version.access)] = 0
        row_groups[split] = write_petastorm_metadata(split_url, unischema, files[split])
    attempt_dir = Location(attempt_url, version.access)
    write_quarantine(attempt_dir, report.quarantine_parts)
    attempt_dir.write_bytes("labels.json", json.dumps(label_index, indent=2).encode())

    manifest = DatasetManifest(
        path=attempt_url,
        fingerprint=fingerprint,
        train_url=dataset_url(join(attempt_url, "train")),
        val_url=dataset_url(join(attempt_url, "val")),
        train_rows=done["train"],
        val_rows=done["val"],
        quarantined=report.bad,
        label_map=label_index,
        image_shape=image_shape(config.image_size, config.color_mode),
        quarantine_path=join(attempt_url, "quarantine.csv"),
        attempt=attempt,
        train_row_groups=row_groups["train"],
        val_row_groups=row_groups["val"],
    )
    return _publish(version, attempt, manifest, config)


# --- publishing -------------------------------------------------------------------------------


def read_manifest(version: Location) -> DatasetManifest | None:
    """The dataset published in ``version``; None when there is none, or when files it needs
    are gone (deleted by hand, or by a bucket's lifecycle rule): that one is built again."""
    data = version.read_bytes(MANIFEST)
    if data is None:
        return None
    record = json.loads(data)
    fields = DatasetManifest.__dataclass_fields__
    record = {k: v for k, v in record.items() if k in fields}
    record["image_shape"] = tuple(record["image_shape"])
    record["reused"] = True
    manifest = DatasetManifest(**record)
    missing = missing_files(Location(manifest.path, version.access))
    if missing:
        logger.warning(
            "dataset %s lacks %d of its files (e.g. %s): it will be built again",
            manifest.path,
            len(missing),
            missing[0],
        )
        return None
    return manifest


def missing_files(attempt: Location) -> list[str]:
    """What a published attempt lacks of its reports, of each split's ``_common_metadata``, and
    of the part files that metadata names (one listing, and a read of each metadata file)."""
    from hvdflow.tasks.preprocess.write import SPLITS

    present = attempt.files()
    missing = [name for name in ATTEMPT_FILES if name not in present]
    for split in SPLITS:
        metadata = f"{split}/_common_metadata"
        if metadata not in present:
            missing.append(metadata)
            continue
        parts = (f"{split}/{part}" for part in _part_files(attempt.read_bytes(metadata)))
        missing += [part for part in parts if part not in present]
    return missing


def _part_files(common_metadata: bytes) -> list[str]:
    """The part files a split's ``_common_metadata`` names (Petastorm's row groups per file)."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    from petastorm.etl.dataset_metadata import ROW_GROUPS_PER_FILE_KEY

    metadata = pq.read_metadata(pa.BufferReader(common_metadata)).metadata or {}
    return sorted(json.loads(metadata.get(ROW_GROUPS_PER_FILE_KEY, b"{}")))


def _publish(version: Location, attempt: str, manifest: DatasetManifest, config) -> DatasetManifest:
    """Write the manifest (the moment the attempt becomes the dataset), then tidy up."""
    other = read_manifest(version)
    if other is not None:  # a concurrent run published first: keep its dataset
        logger.info(
            "dataset %s was published meanwhile (%s): keeping it", version.base, other.attempt
        )
        version.remove_tree(attempt)
        return other
    record = {
        **asdict(manifest),
        "params": config.params(),
        "input": config.input,
        "created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    record.pop("reused")
    version.write_bytes(MANIFEST, json.dumps(record, indent=2).encode())
    for name in version.subfolders():
        if name.startswith(ATTEMPT_PREFIX) and name != attempt:
            try:
                version.remove_tree(name)
                logger.info("removed %s, left by an unfinished run", version.join(name))
            except Exception as e:  # never read (no manifest names it): only clutter
                logger.warning("could not remove %s: %s", version.join(name), e)
    return manifest
