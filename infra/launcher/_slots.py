"""How many barrier tasks the cluster can run at once, and waiting for enough of them.

Barrier mode starts every rank at once: a stage with more tasks than slots would wait, and Spark
re-checks it for minutes. The runner fails fast instead, naming np and the slots there are.
"""

from __future__ import annotations

import logging
import re
import time

from hvdflow.infra.connect import is_connect

logger = logging.getLogger(__name__)

_LOCAL_MASTER = re.compile(r"local\[(\d+)(,\d+)?\]$")
# What Spark's barrier check says when it refuses a stage that asks for more task slots than
# the cluster has (after spark.scheduler.barrier.maxConcurrentTasksCheck.maxFailures checks).
SLOTS_REFUSED = "SPARK-24819"
# How often a refused stage is submitted again while slot_wait_s lasts.
RESUBMIT_EVERY_S = 1.0


def refused_for_slots(error: BaseException | str) -> bool:
    """Whether Spark refused a barrier stage for want of task slots: no task of it started."""
    return SLOTS_REFUSED in str(error)


def task_slots(spark) -> int | None:
    """Tasks the cluster can run at once now (executor cores / spark.task.cpus, summed).

    Through Spark Connect there is no SparkContext to ask: a ``local[N]`` server's master says
    N; for any other, None (not known here).
    """
    if is_connect(spark):
        local = _LOCAL_MASTER.match(spark.conf.get("spark.master", ""))
        if local is None:
            return None
        return int(local.group(1)) // int(spark.conf.get("spark.task.cpus", "1"))
    jsc = spark.sparkContext._jsc.sc()
    profile = jsc.resourceProfileManager().defaultResourceProfile()
    return int(jsc.maxNumConcurrentTasks(profile))


def task_gpu_amount(conf, resource_name: str) -> float | None:
    """``spark.task.resource.<name>.amount``: the GPUs each task holds, None where unset."""
    value = conf.get(f"spark.task.resource.{resource_name}.amount", None)
    return float(value) if value is not None else None


def wait_for_slots(
    spark, tasks: int, wait_s: float, asked: str | None = None, setting: str = "np"
) -> None:
    """Fail fast where Spark would re-check a barrier stage without slots for minutes.

    ``asked`` says what needs the ``tasks`` slots (default: ``np=<tasks>``); ``setting`` is the
    argument to lower. Where the slots cannot be counted (Spark Connect to a cluster), Spark's
    own barrier check decides (``spark.scheduler.barrier.maxConcurrentTasksCheck.*``).
    """
    asked = asked or f"np={tasks}"
    deadline = time.monotonic() + wait_s
    while (slots := task_slots(spark)) is not None and slots < tasks:
        if time.monotonic() >= deadline:
            master = spark.conf.get("spark.master", "?")
            raise RuntimeError(
                f"{asked} needs {tasks} task slots but the cluster ({master}) has {slots} "
                f"after waiting {wait_s:g} s (slot_wait_s): lower {setting}, or add executors, "
                "cores or GPUs (barrier mode starts every task at once)"
            )
        time.sleep(0.5)
    if slots is None:
        logger.info(
            "%s: the cluster's free task slots cannot be counted through Spark Connect; Spark's "
            "barrier check fails the stage if there are fewer than %d",
            asked,
            tasks,
        )
