"""How many barrier tasks the cluster can run at once, and waiting for enough of them.

Barrier mode starts every rank at once: a stage with more tasks than slots would wait, and Spark
re-checks it for minutes. The runner fails fast instead, naming np and the slots there are.
"""

from __future__ import annotations

import time


def task_slots(sc) -> int:
    """Tasks the cluster can run at once now (executor cores / spark.task.cpus, summed)."""
    jsc = sc._jsc.sc()
    profile = jsc.resourceProfileManager().defaultResourceProfile()
    return int(jsc.maxNumConcurrentTasks(profile))


def task_gpu_amount(conf, resource_name: str) -> float | None:
    """``spark.task.resource.<name>.amount``: the GPUs each task holds, None where unset."""
    value = conf.get(f"spark.task.resource.{resource_name}.amount", None)
    return float(value) if value is not None else None


def wait_for_slots(
    sc, tasks: int, wait_s: float, asked: str | None = None, setting: str = "np"
) -> None:
    """Fail fast where Spark would re-check a barrier stage without slots for minutes.

    ``asked`` says what needs the ``tasks`` slots (default: ``np=<tasks>``); ``setting`` is the
    argument to lower.
    """
    asked = asked or f"np={tasks}"
    deadline = time.monotonic() + wait_s
    while (slots := task_slots(sc)) < tasks:
        if time.monotonic() >= deadline:
            raise RuntimeError(
                f"{asked} needs {tasks} task slots but the cluster ({sc.master}) has {slots} "
                f"after waiting {wait_s:g} s (slot_wait_s): lower {setting}, or add executors, "
                "cores or GPUs (barrier mode starts every task at once)"
            )
        time.sleep(0.5)
