"""Python work planned on the driver, one slice per Spark task, over a DataFrame: the same on a
classic session and through Spark Connect (which has no ``sc.parallelize``).

``spark.range(0, n, 1, numPartitions=n)`` puts id i in partition i, so task i runs slice i; the
slices travel with the function (small pickled plans, not data). ``map_slices`` brings each
task's results back as pickled rows; ``slices_frame`` makes a DataFrame whose partition i holds
slice i's rows, for a stage that goes on from there (``mapInPandas``...).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator, Sequence
from functools import partial
from typing import Any

import cloudpickle

from hvdflow.infra.connect import is_connect
from hvdflow.infra.launcher._driver import task_slots

logger = logging.getLogger(__name__)

RESULT_SCHEMA = "slice int, seq int, value binary"
# Results per Arrow batch a task sends back.
BATCH_ROWS = 512
# Tasks in a wave where Spark Connect to a cluster says nothing of its size.
UNKNOWN_PARALLELISM = 8


def default_parallelism(spark) -> int:
    """How many tasks run at once by default: ``sc.defaultParallelism`` on a classic session;
    through Spark Connect, ``spark.default.parallelism`` where the server sets it, else its
    ``local[N]``, else UNKNOWN_PARALLELISM."""
    if not is_connect(spark):
        return spark.sparkContext.defaultParallelism
    configured = spark.conf.get("spark.default.parallelism", None)
    if configured:
        return int(configured)
    slots = task_slots(spark)
    if slots is None:
        logger.info(
            "the cluster behind Spark Connect does not say how many tasks it runs at once: "
            "planning %d (set spark.default.parallelism on the server to choose)",
            UNKNOWN_PARALLELISM,
        )
        return UNKNOWN_PARALLELISM
    return slots


def _run_slices(fn: Callable[[Iterator], Iterable], slices: Sequence, batches):
    """``mapInArrow``'s function: ``fn`` over this task's slice, its results pickled."""
    import pyarrow as pa  # noqa: PLC0415 (executors: Spark's Arrow runner has loaded it)

    schema = pa.schema([("slice", pa.int32()), ("seq", pa.int32()), ("value", pa.binary())])
    for batch in batches:
        for index in batch.column(0).to_pylist():
            rows: dict[str, list] = {"slice": [], "seq": [], "value": []}
            for seq, value in enumerate(fn(iter([slices[index]]))):
                rows["slice"].append(index)
                rows["seq"].append(seq)
                rows["value"].append(cloudpickle.dumps(value))
                if len(rows["seq"]) >= BATCH_ROWS:
                    yield pa.RecordBatch.from_pydict(rows, schema=schema)
                    rows = {"slice": [], "seq": [], "value": []}
            if rows["seq"]:
                yield pa.RecordBatch.from_pydict(rows, schema=schema)


# Arrow types of the DDL names slices_frame's schemas use.
_ARROW_TYPES = {"string": "string", "int": "int32", "long": "int64", "double": "float64"}


def _emit_rows(slices: Sequence[Sequence[tuple]], schema: str, batches):
    """``mapInArrow``'s function: this task's slice as Arrow rows of ``schema``."""
    import pyarrow as pa  # noqa: PLC0415 (executors: Spark's Arrow runner has loaded it)

    fields = [field.split() for field in schema.split(",")]
    arrow = pa.schema([(name, getattr(pa, _ARROW_TYPES[kind])()) for name, kind in fields])
    for batch in batches:
        for index in batch.column(0).to_pylist():
            rows = slices[index]
            if rows:
                columns = zip(*rows, strict=True)
                arrays = [pa.array(c, type=t) for c, t in zip(columns, arrow.types, strict=True)]
                yield pa.RecordBatch.from_arrays(arrays, schema=arrow)


def slices_frame(spark, slices: Sequence[Sequence[tuple]], schema: str):
    """A DataFrame of ``schema`` (DDL of string, int, long and double columns) whose partition i
    holds the rows (tuples) of ``slices[i]``: work planned per task, for the stage to go on."""
    unknown = {f.split()[1] for f in schema.split(",")} - set(_ARROW_TYPES)
    if unknown:
        raise ValueError(f"slices_frame: column types {sorted(unknown)} are not supported")
    return spark.range(0, len(slices), 1, numPartitions=len(slices)).mapInArrow(
        partial(_emit_rows, [list(rows) for rows in slices], schema), schema
    )


def job_description(spark, description: str | None) -> None:
    """Name the next jobs in the Spark UI (classic sessions; Spark Connect has no SparkContext)."""
    if not is_connect(spark):
        spark.sparkContext.setJobDescription(description)


def map_slices(
    spark, slices: Sequence, fn: Callable[[Iterator], Iterable], description: str
) -> list[Any]:
    """``fn(iter([slice]))`` for each slice, one Spark task each; every result, slice by slice.

    ``fn`` takes an iterator as ``RDD.mapPartitions``'s function does. ``description`` names
    the job in the Spark UI (classic sessions).
    """
    if not slices:
        return []
    frame = spark.range(0, len(slices), 1, numPartitions=len(slices)).mapInArrow(
        partial(_run_slices, fn, list(slices)), RESULT_SCHEMA
    )
    job_description(spark, description)
    try:
        rows = frame.collect()
    finally:
        job_description(spark, None)
    rows.sort(key=lambda row: (row.slice, row.seq))
    return [cloudpickle.loads(row.value) for row in rows]
