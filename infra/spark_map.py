"""Python work planned on the driver, one slice per Spark task, over a DataFrame: the same on a
classic session and through Spark Connect (which has no ``sc.parallelize``).

``spark.range(0, n, 1, numPartitions=n)`` puts id i in partition i, so task i runs slice i; the
slices travel with the function (small pickled plans, not data), each task's results come back
as pickled rows.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator, Sequence
from functools import partial
from typing import Any

import cloudpickle

from hvdflow.infra.connect import is_connect
from hvdflow.infra.launcher._slots import task_slots

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
    sc = None if is_connect(spark) else spark.sparkContext
    if sc is not None:
        sc.setJobDescription(description)
    try:
        rows = frame.collect()
    finally:
        if sc is not None:
            sc.setJobDescription(None)
    rows.sort(key=lambda row: (row.slice, row.seq))
    return [cloudpickle.loads(row.value) for row in rows]
