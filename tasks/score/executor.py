"""Executor side of scoring: units of work in (Arrow batches), prediction files written out.

``score_partition`` is the job's ``mapInPandas`` function: it fetches and decodes every planned
image as preprocessing does (``Fetcher``), predicts ``batch_size`` at a time with the process's
cached model, and writes ``predictions/part-NNNNN.parquet`` and ``quarantine/part-NNNNN.csv``
to the attempt folder. Predictions never reach the JVM or the driver: the task returns a few
report rows (``REPORT_SCHEMA``). Files are named by partition, so a retried task rewrites them.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections import Counter
from dataclasses import dataclass

import numpy as np

from hvdflow.infra.storage.access import S3Access
from hvdflow.infra.storage.uris import is_s3, join
from hvdflow.serving.images import model_input
from hvdflow.tasks.images.decode import Bad
from hvdflow.tasks.images.fetch import FETCH_AHEAD, Fetcher, check_input_root, host
from hvdflow.tasks.images.listing import Item
from hvdflow.tasks.images.parquet import ParquetPart
from hvdflow.tasks.images.partitions import part_name
from hvdflow.tasks.images.quarantine import write_quarantine_part
from hvdflow.tasks.score import model_cache
from hvdflow.tasks.score.inputs import WHOLE_FILE

INPUT_SCHEMA = "source string, path string, row_group int, problem string"
# kind: predictions (name: part file, count: rows), class (name: class index, count: rows),
# quarantine (name: part file, count: rows), reason (name: kind of reason, count: inputs),
# example (name: "source\0reason"), process (name: JSON of host, pid, loads, horovod),
# milliseconds (name: load, predict or fetch_decode_write: where the task's time went).
REPORT_SCHEMA = "kind string, name string, count long"
PREDICTION_COLUMNS = ("source", "class_name", "class_index", "probability")
# Predictions per Parquet row group: a few MB of strings and numbers.
ROW_GROUP_ROWS = 100_000


@dataclass(frozen=True)
class ExecutorPlan:
    """What every scoring task needs, as plain values (it travels in the Spark closure)."""

    model_key: tuple[str, str]
    archive: str  # the model's archive, unpacked by Spark on every executor
    labels: tuple[str, ...]
    image_size: tuple[int, int]
    color_mode: str
    max_pixels: int
    batch_size: int
    root: str  # the input folder (checked on every executor) or s3:// prefix
    attempt_url: str
    access: S3Access | None  # for s3:// inputs or outputs


def prediction_schema():
    import pyarrow as pa

    return pa.schema(
        [
            pa.field("source", pa.string(), nullable=False),
            pa.field("class_name", pa.string(), nullable=False),
            pa.field("class_index", pa.int32(), nullable=False),
            pa.field("probability", pa.float32(), nullable=False),
        ]
    )


def score_partition(batches, plan: ExecutorPlan):
    """mapInPandas: pandas batches of INPUT_SCHEMA rows in, REPORT_SCHEMA rows out."""
    import pandas as pd
    from pyspark import TaskContext

    context = TaskContext.get()
    partition = context.partitionId() if context else 0
    threads = max(1, context.cpus()) if context else 1
    rows = _score(batches, plan, partition, threads)
    yield pd.DataFrame(rows, columns=["kind", "name", "count"])


def _score(batches, plan: ExecutorPlan, partition: int, threads: int) -> list[tuple]:
    if not is_s3(plan.root):
        check_input_root(plan.root)
    uses_s3 = is_s3(plan.root) or is_s3(plan.attempt_url)
    client = plan.access.client(connections=FETCH_AHEAD) if uses_s3 else None
    out = _PredictionFile(join(plan.attempt_url, "predictions", part_name(partition)), plan, client)
    # Fetched ahead from object storage only (locally, threads would compete with decoding).
    fetcher = Fetcher(plan.access if is_s3(plan.root) else None, client)
    counts: Counter = Counter()
    bad: list[tuple[str, str]] = []
    timing: Counter = Counter()
    pending_images, pending_sources = [], []

    def predict() -> None:
        started = time.perf_counter()
        predict_proba = model_cache.cached_model(plan.model_key, plan.archive, threads)
        loaded = time.perf_counter()
        probabilities = np.asarray(predict_proba(model_input(pending_images)))
        classes = probabilities.argmax(axis=1)
        timing["load"] += loaded - started
        timing["predict"] += time.perf_counter() - loaded
        out.add(pending_sources, classes, probabilities[np.arange(len(classes)), classes])
        counts.update(classes.tolist())
        pending_images.clear()
        pending_sources.clear()

    started = time.perf_counter()
    try:
        records = fetcher.records(
            _items(batches), plan.image_size, plan.color_mode, plan.max_pixels
        )
        for record in records:
            if isinstance(record, Bad):
                bad.append((record.source, record.reason))
                continue
            pending_sources.append(record.source)
            pending_images.append(record.image)
            if len(pending_images) >= plan.batch_size:
                predict()
        if pending_images:
            predict()
        out.close()
    except BaseException:
        out.abort()
        raise
    finally:
        fetcher.close()
        # This worker may end without running its atexit hooks, AutoGraph's among them.
        generated = model_cache.forget_generated_sources()
    elapsed = time.perf_counter() - started
    timing["fetch_decode_write"] = elapsed - timing["load"] - timing["predict"]
    return _report(plan, partition, out, counts, bad, timing, client, generated)


def _items(batches):
    """The listed units (``inputs.Unit``) of the task's batches, as the Fetcher reads them."""
    for batch in batches:
        columns = (batch["source"], batch["path"], batch["row_group"], batch["problem"])
        for source, path, row_group, problem in zip(*columns, strict=True):
            row_group = None if int(row_group) == WHOLE_FILE else int(row_group)
            yield Item(source, "", path, problem=problem or None, row_group=row_group)


def _report(plan, partition, out, counts, bad, timing, client, generated) -> list[tuple]:
    rows: list[tuple] = []
    if out.rows:
        rows.append(("predictions", part_name(partition), out.rows))
    rows += [("class", str(index), count) for index, count in sorted(counts.items())]
    if bad:
        bad.sort()
        name = write_quarantine_part(plan.attempt_url, partition, bad, plan.access, client)
        rows.append(("quarantine", name, len(bad)))
        kinds = Counter(reason.split(":")[0] for _, reason in bad)
        rows += [("reason", kind, count) for kind, count in kinds.items()]
        rows += [("example", f"{source}\0{reason}", 0) for source, reason in bad[:3]]
    process = {
        "host": host(),
        "pid": os.getpid(),
        "loads": model_cache.loads(),
        "horovod": "horovod" in sys.modules,
        # AutoGraph's modules in this process, and how many of their files are left in /tmp.
        "autograph_modules": generated[0],
        "autograph_files_left": generated[1],
    }
    rows.append(("process", json.dumps(process, sort_keys=True), 0))
    rows += [("milliseconds", kind, int(seconds * 1000)) for kind, seconds in timing.items()]
    return rows


class _PredictionFile:
    """One partition's Parquet file of predictions; created at the first row group."""

    def __init__(self, url: str, plan: ExecutorPlan, client):
        self.labels = plan.labels
        self.columns: dict[str, list] = {name: [] for name in PREDICTION_COLUMNS}
        self.rows = 0
        self._part = ParquetPart(url, prediction_schema(), plan.access, client)

    def add(self, sources, classes, probabilities) -> None:
        self.columns["source"] += sources
        self.columns["class_name"] += [self.labels[int(c)] for c in classes]
        self.columns["class_index"] += [int(c) for c in classes]
        self.columns["probability"] += [float(p) for p in probabilities]
        if len(self.columns["source"]) >= ROW_GROUP_ROWS:
            self._flush()

    def _flush(self) -> None:
        import pyarrow as pa

        if not self.columns["source"]:
            return
        table = pa.Table.from_pydict(self.columns, schema=self._part.schema)
        self._part.write(table)
        self.rows += table.num_rows
        self.columns = {name: [] for name in PREDICTION_COLUMNS}

    def close(self) -> None:
        self._flush()
        self._part.close()

    def abort(self) -> None:
        self._part.abort()
