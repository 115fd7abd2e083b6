"""Writing a dataset: Parquet part files from the executors, Petastorm metadata from the driver.

``write_partition`` is the one Spark stage of preprocessing: each task decodes the items the
driver planned for its partition (decode.py), puts each image in its split and writes the
planned row groups to ``train/`` and ``val/part-NNNNN.parquet``, its unusable inputs to
``quarantine/part-NNNNN.csv``. File names are the partition's number, so a task Spark retries
rewrites the same files; each appears only once complete (storage.open_for_write).

Then the driver writes ``_common_metadata`` with Petastorm's own utilities (what
``materialize_dataset`` does), and beside it the same fields and row groups as plain JSON, which
a rank reads with pyarrow alone (``hvdflow.training.parquet_reader``).
"""

from __future__ import annotations

import json
import math
import os
import pickle
import warnings
from collections import Counter
from dataclasses import dataclass
from typing import NamedTuple

from hvdflow.infra.storage.access import S3Access
from hvdflow.infra.storage.files import open_for_write
from hvdflow.infra.storage.uris import dataset_url, is_s3, join
from hvdflow.tasks.images.decode import Bad
from hvdflow.tasks.images.fetch import FETCH_AHEAD
from hvdflow.tasks.images.parquet import ParquetPart
from hvdflow.tasks.images.partitions import part_name
from hvdflow.tasks.images.quarantine import write_quarantine_part
from hvdflow.tasks.preprocess.decode import decode_records
from hvdflow.tasks.preprocess.split import is_val
from hvdflow.training.parquet_reader import SCHEMA_FILE, FieldDescription, SplitDescription
from hvdflow.training.reader import filesystem_for

SPLITS = ("train", "val")
# Big enough for sequential reads, small enough for a reader worker's memory.
ROW_GROUP_BYTES = 64 << 20
# Test hook (executorEnv): the partition whose write task dies (os._exit, as a killed executor
# would) right after its first file is complete.
CRASH_AFTER_FIRST_FILE_ENV = "HVDFLOW_TEST_CRASH_PARTITION_AFTER_FIRST_FILE"
# Distinct kinds of reasons a task reports for its unusable inputs (the rest: "other").
MAX_REASON_KINDS = 20


def row_groups_for(rows: int, nbytes: int, shards: int) -> int:
    """Row groups one split gets: at least ``shards`` (one per rank), more when they would
    exceed ROW_GROUP_BYTES; never more than its rows."""
    return min(rows, max(shards, math.ceil(nbytes / ROW_GROUP_BYTES)))


def plan_row_groups(counts: list[int], groups: int) -> list[list[int]]:
    """Row-group sizes for each partition's file of one split (``counts``: its rows per
    partition): at least ``groups`` where the rows allow, none empty, as even as possible."""
    total = sum(counts)
    if total == 0:
        return [[] for _ in counts]
    groups = min(groups, total)
    quotas = [count * groups / total for count in counts]
    alloc = [min(c, max(1, math.floor(q))) if c else 0 for c, q in zip(counts, quotas, strict=True)]
    short = groups - sum(alloc)
    order = sorted(range(len(counts)), key=lambda i: (-(quotas[i] - math.floor(quotas[i])), i))
    while short > 0:
        for i in order:
            if short and alloc[i] < counts[i]:
                alloc[i] += 1
                short -= 1
    return [
        [count // g + (1 if i < count % g else 0) for i in range(g)]
        for count, g in zip(counts, alloc, strict=True)
    ]


@dataclass(frozen=True)
class WritePlan:
    """What every task needs, as plain values (it travels in the Spark closure)."""

    decode: object  # decode.DecodePlan
    attempt_url: str  # the attempt's folder: local path or s3:// URI
    access: S3Access | None
    rules: dict  # label -> split.Boundary: which records are validation
    sizes: dict[int, dict[str, list[int]]]  # partition -> split -> row-group sizes (listed)


def arrow_schema():
    """The Parquet files' columns: Petastorm's Spark schema of the Unischema, in Arrow types."""
    import pyarrow as pa

    return pa.schema(
        [
            pa.field("image", pa.binary(), nullable=False),
            pa.field("label", pa.int32(), nullable=False),
            pa.field("source", pa.string(), nullable=False),
            pa.field("split", pa.string(), nullable=False),
        ]
    )


# The images are encoded already: compressing, dictionaries or statistics of them buy nothing.
PARQUET_OPTIONS = {
    "compression": {"image": "NONE", "label": "SNAPPY", "source": "SNAPPY", "split": "SNAPPY"},
    "use_dictionary": ["label", "source", "split"],
    "write_statistics": ["label", "source", "split"],
}


class _SplitFile:
    """One partition's Parquet file of one split, cut into the planned row groups. So that
    unusable inputs cannot cost a row group (a rank its data), it holds back one row for each
    planned group still to come: it ends with ``min(planned groups, rows)`` row groups."""

    def __init__(self, url: str, split: str, sizes: list[int], access, client):
        self.split, self.sizes = split, list(sizes)
        self.sources: list[str] = []
        self.labels: list[int] = []
        self.images: list[bytes] = []
        self.written = 0
        self.groups = 0
        self._part = ParquetPart(url, arrow_schema(), access, client, **PARQUET_OPTIONS)

    def add(self, row) -> None:
        self.sources.append(row.source)
        self.labels.append(row.label)
        self.images.append(row.image)
        while (left := len(self.sizes) - self.groups) > 1 and (
            len(self.sources) - self.sizes[self.groups] >= left - 1
        ):
            self._flush(self.sizes[self.groups])

    def _flush(self, rows: int) -> None:
        import pyarrow as pa

        table = pa.Table.from_arrays(
            [
                pa.array(self.images[:rows], pa.binary()),
                pa.array(self.labels[:rows], pa.int32()),
                pa.array(self.sources[:rows], pa.string()),
                pa.array([self.split] * rows, pa.string()),
            ],
            schema=self._part.schema,
        )
        self._part.write(table, row_group_size=rows)
        self.written += rows
        self.groups += 1
        del self.images[:rows], self.labels[:rows], self.sources[:rows]

    def close(self) -> None:
        rows = len(self.sources)
        groups = max(1, min(len(self.sizes) - self.groups, rows))
        for i in range(groups if rows else 0):
            self._flush(rows // groups + (1 if i < rows % groups else 0))
        self._part.close()

    def abort(self) -> None:
        self._part.abort()


def _crash_for_tests(partition: int) -> None:
    """The test hook (CRASH_AFTER_FIRST_FILE_ENV): die like a killed executor, mid-write."""
    if os.environ.get(CRASH_AFTER_FIRST_FILE_ENV) == str(partition):
        os._exit(70)


class Written(NamedTuple):
    """What a write task reports: a part file (kind train, val or quarantine), its unusable
    inputs of one kind (kind "reason": name is the kind, rows how many), or up to three of them
    (kind "example": name is "source\\0reason")."""

    kind: str
    name: str
    rows: int
    row_groups: int


def write_partition(planned, plan: WritePlan):
    """mapPartitions over (partition, items) pairs: decode, split and write every partition's
    items; yield what was written (Written)."""
    for partition, items in planned:
        yield from _write_one(partition, items, plan)


def _write_one(partition: int, items, plan: WritePlan):
    sizes = plan.sizes.get(partition, {})
    # One boto3 client per partition, for reading the inputs and writing the files.
    uses_s3 = is_s3(plan.attempt_url) or is_s3(plan.decode.root)
    client = plan.access.client(connections=FETCH_AHEAD) if uses_s3 else None
    files = {
        split: _SplitFile(
            join(plan.attempt_url, split, part_name(partition)),
            split,
            sizes.get(split, []),
            plan.access,
            client,
        )
        for split in SPLITS
    }
    bad: list[tuple[str, str]] = []
    try:
        for record in decode_records(items, plan.decode, client):
            if isinstance(record, Bad):
                bad.append((record.source, record.reason))
            elif is_val(plan.rules, record.label, record.key, record.source):
                files["val"].add(record)
            else:
                files["train"].add(record)
        for split in SPLITS:
            files[split].close()
            if files[split].groups:
                name = part_name(partition)
                yield Written(split, name, files[split].written, files[split].groups)
                _crash_for_tests(partition)
        if bad:
            bad.sort()
            name = write_quarantine_part(plan.attempt_url, partition, bad, plan.access, client)
            yield Written("quarantine", name, len(bad), 0)
            yield from _reasons(bad)
    except BaseException:
        for split_file in files.values():
            split_file.abort()
        raise


def _reasons(bad: list[tuple[str, str]]):
    """How many unusable inputs of each kind, and the first three (for the driver's checks)."""
    kinds: Counter = Counter()
    for _, reason in bad:
        kind = reason.split(":")[0]
        if kind not in kinds and len(kinds) >= MAX_REASON_KINDS:
            kind = "other"
        kinds[kind] += 1
    for kind, count in kinds.items():
        yield Written("reason", kind, count, 0)
    for source, reason in bad[:3]:
        yield Written("example", f"{source}\0{reason}", 0, 0)


# --- the driver, after the executors ------------------------------------------------------


def write_empty_split(split_url: str, schema, access) -> str:
    """An empty split (val_fraction=0): one file with no rows, so the dataset still opens."""
    import pyarrow.parquet as pq

    name = part_name(0)
    with open_for_write(join(split_url, name), access) as f:
        pq.ParquetWriter(f, schema).close()
    return name


def write_petastorm_metadata(split_url: str, unischema, row_groups: dict[str, int]) -> int:
    """``_common_metadata`` with the pickled Unischema and the row groups per file, through the
    filesystem Petastorm's reader uses; returns the row groups Petastorm then sees."""
    import pyarrow.parquet as pq
    from petastorm.etl.dataset_metadata import (
        ROW_GROUPS_PER_FILE_KEY,
        UNISCHEMA_KEY,
        load_row_groups,
    )
    from petastorm.fs_utils import get_filesystem_and_path_or_paths
    from petastorm.utils import add_to_dataset_metadata

    url = dataset_url(split_url)
    fs, path = get_filesystem_and_path_or_paths(url, filesystem=filesystem_for(url))
    if is_s3(url) and hasattr(fs, "fs"):
        fs.fs.invalidate_cache()  # the executors wrote behind s3fs' back

    def open_dataset():
        return pq.ParquetDataset(path, filesystem=fs, validate_schema=False)

    with warnings.catch_warnings():
        # pyarrow's legacy dataset API, deprecated, is the one petastorm 0.13 reads with.
        warnings.simplefilter("ignore", FutureWarning)
        dataset = open_dataset()
        add_to_dataset_metadata(dataset, UNISCHEMA_KEY, pickle.dumps(unischema))
        add_to_dataset_metadata(dataset, ROW_GROUPS_PER_FILE_KEY, json.dumps(row_groups).encode())
        seen = len(load_row_groups(open_dataset()))
    expected = sum(row_groups.values())
    if seen != expected:
        raise RuntimeError(
            f"{url}: Petastorm sees {seen} row groups, the executors wrote {expected}: files "
            "changed while the metadata was written; run the preprocessing again"
        )
    return seen


def write_split_description(
    split_url: str, fields: tuple[FieldDescription, ...], row_groups: dict[str, int], access
) -> str:
    """``_hvdflow_schema.json``: the split's fields and row groups per part file; its URL."""
    url = join(split_url, SCHEMA_FILE)
    with open_for_write(url, access) as f:
        f.write(SplitDescription(tuple(fields), dict(row_groups)).to_json())
    return url
