"""What a failed barrier job's error says: the task's own Python error, found in the text Spark
wraps it in (Spark 3's py4j form and Spark 4's, classic or Connect); and the one line a rank's
failure reads as in a log record."""

from __future__ import annotations

import pytest

from hvdflow.infra.launcher.errors import (
    OUTPUT_HEADING,
    STACKS_HEADING,
    RankFailed,
    first_line,
    headline,
    rank_failed,
)

pytestmark = pytest.mark.unit

REFUSED = (
    "hvdflow.infra.launcher.errors.RankFailed: rank slot 1 could not reach the driver at "
    "198.18.0.2:50547 within 30 s (hvdflow.infra.launcher._task.CONNECT_TIMEOUT_S): [Errno 101] "
    "Network is unreachable."
)

# As pyspark's Connect client raised it from a Spark 4.3 server (the JVM's stack cut short).
SPARK_4_BARRIER = f"""Job aborted due to stage failure: Could not recover from a failed barrier \
ResultStage. Most recent failure reason: Stage failed because barrier task ResultTask(0, 1) \
finished unsuccessfully.
org.apache.spark.api.python.PythonException: [PYTHON_EXCEPTION] An exception was thrown from \
the Python worker: Traceback (most recent call last):
  File "/work/main/infra/launcher/_driver.py", line 55, in barrier_batches
    for result in barrier_task(spec, ()):
{REFUSED}
 SQLSTATE: 38000


JVM stacktrace:
org.apache.spark.SparkException
\tat org.apache.spark.scheduler.DAGScheduler.abortStage(DAGScheduler.scala:4560)"""

SPARK_3_PY4J = f"""An error occurred while calling o71.collect.
: org.apache.spark.SparkException: Job aborted due to stage failure: Task 1 in stage 0.0 failed
org.apache.spark.api.python.PythonException: Traceback (most recent call last):
  File "/work/main/infra/launcher/_driver.py", line 55, in barrier_batches
{REFUSED}
\tat org.apache.spark.api.python.BasePythonRunner$ReaderIterator.handlePythonException"""


@pytest.mark.parametrize("text", [SPARK_4_BARRIER, SPARK_3_PY4J], ids=["spark-4", "spark-3"])
def test_a_tasks_python_error_is_the_line_a_failed_barrier_job_is_reported_by(text):
    assert first_line(RuntimeError(text)) == REFUSED


def test_without_a_python_traceback_the_first_useful_line_is_kept():
    text = "An error occurred while calling o9.collect.\nJob aborted: the executor was lost"
    assert first_line(RuntimeError(text)) == "Job aborted: the executor was lost"
    assert first_line(RuntimeError("Job 3 cancelled part of cancelled job tag x")) == (
        "it was cancelled"
    )


def test_a_rank_failures_headline_ends_with_what_happened_not_the_heading_of_its_tail():
    killed = rank_failed(
        "HorovodRunner np=2: rank 1 on vm (127.0.0.1) was killed by SIGKILL (exit -9). "
        f"{OUTPUT_HEADING}\n[1,1]<stdout>:Epoch 2/5",
        "signal",
    )
    assert headline(killed) == (
        "HorovodRunner np=2: rank 1 on vm (127.0.0.1) was killed by SIGKILL (exit -9)."
    )
    stalled = RankFailed(f"HorovodRunner np=2 stalled. {STACKS_HEADING}\n[1,0]: File ...")
    assert headline(stalled) == "HorovodRunner np=2 stalled."
    assert headline(ValueError("no tail here\nsecond line")) == "no tail here"
    assert headline(ValueError()) == "ValueError"
