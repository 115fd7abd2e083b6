"""The barrier stage that runs the ranks: one DataFrame stage, the same on a classic session and
through Spark Connect, where there is no SparkContext and no RDD.

As pyspark's own TorchDistributor does since Spark 3.5 (SPARK-42896): ``spark.range`` gives one
row per task, ``mapInArrow(..., barrier=True)`` runs each task's ranks with a
``BarrierTaskContext``, and rank 0's task answers with its pickled result, cut into rows of at
most ``CHUNK_BYTES`` (Spark Connect sends results in Arrow batches of a few MB; one row larger
than its gRPC message limit would fail the run after training had finished).

Cancelling is by tag (``addTag``/``interruptTag``, per thread on both kinds of session), which
Spark Connect has and job groups are not.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from functools import partial

from hvdflow.infra.launcher._task import TaskSpec, barrier_task

RESULT_SCHEMA = "seq int, chunk binary"
# Well under Spark Connect's Arrow batch size (spark.connect.grpc.arrow.maxBatchSize, 4 MB).
CHUNK_BYTES = 1 << 20


def chunks(data: bytes, size: int = CHUNK_BYTES) -> Iterator[tuple[int, bytes]]:
    """``data`` as numbered pieces of at most ``size`` bytes (one empty piece for no bytes)."""
    if not data:
        yield 0, b""
        return
    for seq, start in enumerate(range(0, len(data), size)):
        yield seq, data[start : start + size]


def joined(rows: Iterable[tuple[int, bytes]]) -> bytes | None:
    """The bytes ``chunks`` cut, from its rows in any order; None where there are none."""
    ordered = sorted(rows, key=lambda row: row[0])
    if not ordered:
        return None
    if [seq for seq, _ in ordered] != list(range(len(ordered))):
        raise RuntimeError(
            f"rank 0's result came back as pieces {[seq for seq, _ in ordered]}: some are "
            "missing or repeated"
        )
    return b"".join(bytes(piece) for _, piece in ordered)


def barrier_batches(spec: TaskSpec, batches):
    """``mapInArrow``'s function on each task: run its ranks, answer with rank 0's pieces."""
    import pyarrow as pa  # noqa: PLC0415 (executors: Spark's Arrow runner has loaded it)

    schema = pa.schema([("seq", pa.int32()), ("chunk", pa.binary())])
    for _ in batches:  # the task's one input row says nothing: its partition is its place
        pass
    for result in barrier_task(spec, ()):
        for seq, piece in chunks(result):
            yield pa.RecordBatch.from_pydict({"seq": [seq], "chunk": [piece]}, schema=schema)


def run_barrier_stage(spark, spec: TaskSpec, tasks: int, tag: str) -> bytes | None:
    """Run ``tasks`` barrier tasks under ``tag``; rank 0's pickled result (None if it had none).

    Blocks until the stage ends; ``spark.interruptTag(tag)`` from another thread cancels it.
    """
    spark.addTag(tag)
    try:
        rows = (
            spark.range(0, tasks, 1, numPartitions=tasks)
            .mapInArrow(partial(barrier_batches, spec), RESULT_SCHEMA, barrier=True)
            .collect()
        )
    finally:
        spark.removeTag(tag)
    return joined((row.seq, row.chunk) for row in rows)
