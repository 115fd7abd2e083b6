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


def wait_for_slots(sc, np: int, wait_s: float) -> None:
    """Fail fast where Spark would re-check a barrier stage without slots for minutes."""
    deadline = time.monotonic() + wait_s
    while (slots := task_slots(sc)) < np:
        if time.monotonic() >= deadline:
            raise RuntimeError(
                f"np={np} needs {np} task slots but the cluster ({sc.master}) has {slots} after "
                f"waiting {wait_s:g} s (HorovodRunner slot_wait_s): lower np, or add executors "
                "or cores (barrier mode starts every rank at once)"
            )
        time.sleep(0.5)
