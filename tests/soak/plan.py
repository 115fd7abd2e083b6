"""The fault kinds and a seeded schedule of them: a replayable list of runs, each with at most
one fault, its moment, and whether the run is asked for while the one before still runs."""

from __future__ import annotations

import random
from dataclasses import dataclass, field

# When a fault strikes: in an epoch of the training (`epoch`), or between two runs, on what
# the next one will read (`before`).
EPOCH, BEFORE = "epoch", "before"

# kind -> when it strikes. The order is the table's.
FAULT_KINDS: dict[str, str] = {
    "rank_kill": EPOCH,  # SIGKILL one rank
    "executor_kill": EPOCH,  # SIGKILL the Spark executor that holds a rank's barrier task
    "host_lost": EPOCH,  # every process of a host SIGKILLed, for good (elastic min_np)
    "link_cut": EPOCH,  # a host's cable unplugged for 10-30 s
    "mlflow_restart": EPOCH,  # the tracking server killed, back after 20 s
    "s3_restart": EPOCH,  # SeaweedFS killed, back after 20 s
    "prefect_restart": EPOCH,  # the Prefect server killed and started again at once
    "worker_kill": EPOCH,  # the Prefect worker SIGKILLed, another one started
    "disk_full": EPOCH,  # the hosts' /tmp capped at their use for 15 s, over a checkpoint
    "weights_altered": BEFORE,  # the staged weights object truncated or its bytes changed
    "row_group_corrupt": BEFORE,  # bytes of a published dataset's part file changed
    "broken_images": BEFORE,  # new broken files in the image tree
}


@dataclass(frozen=True)
class PlannedRun:
    index: int
    fault: str | None
    epoch: int  # for an epoch fault: the epoch whose start triggers it
    delay_s: float  # after the trigger, before the fault
    overlap: bool  # asked for while the run before is still in flight
    detail: dict = field(default_factory=dict)  # per kind: which host, how long, which bytes


def make_plan(
    runs: int,
    seed: int,
    kinds: list[str] | None = None,
    *,
    epochs: int,
    each: int = 2,
    clean_first: bool = True,
) -> list[PlannedRun]:
    """``runs`` runs; each kind of ``kinds`` (default: all) in ``each`` of them at least, the
    rest fault-free; from ``seed`` alone. The first run is fault-free (``clean_first``): it
    builds the dataset and stages the weights the others reuse, and a fault "before" it would
    find nothing to break. Without it, the first run meets its fault while it builds them too,
    which only faults that strike within a run can do."""
    kinds = list(kinds or FAULT_KINDS)
    unknown = sorted(set(kinds) - set(FAULT_KINDS))
    if unknown:
        raise ValueError(f"unknown fault kinds {unknown}: expected some of {list(FAULT_KINDS)}")
    before = [k for k in kinds if FAULT_KINDS[k] == BEFORE]
    if not clean_first and before:
        raise ValueError(f"{before} strike before a run: they need a clean first run")
    faulty = [k for k in kinds for _ in range(each)]
    clean = 1 if clean_first else 0
    if runs < len(faulty) + clean:
        raise ValueError(
            f"runs={runs} cannot hold {each} of each of {len(kinds)} fault kinds"
            + (" after a first clean run" if clean_first else "")
            + f": give --runs {len(faulty) + clean} or more, or fewer --kinds"
        )
    rng = random.Random(seed)
    rest: list[str | None] = faulty + [None] * (runs - len(faulty) - clean)
    rng.shuffle(rest)
    ordered = [None, *rest] if clean_first else rest
    plan = []
    for index, fault in enumerate(ordered):
        plan.append(
            PlannedRun(
                index=index,
                fault=fault,
                epoch=rng.randint(2, max(2, epochs - 2)),
                delay_s=round(rng.uniform(0.0, 1.0), 2),
                # Faults on what a run reads strike between runs, not under the one before.
                overlap=index > 0 and FAULT_KINDS.get(fault, EPOCH) == EPOCH and rng.random() < 0.3,
                detail=_detail(fault, rng),
            )
        )
    return plan


def _detail(fault: str | None, rng: random.Random) -> dict:
    if fault == "link_cut":
        return {"host": rng.randrange(2), "seconds": round(rng.uniform(10, 30), 1)}
    if fault in ("rank_kill", "executor_kill"):
        return {"rank": rng.randrange(2)}
    if fault == "weights_altered":
        return {"how": rng.choice(["truncate", "flip"])}
    if fault == "row_group_corrupt":
        return {"offset": round(rng.uniform(0.2, 0.8), 3)}
    if fault == "broken_images":
        return {"count": rng.randint(1, 3)}
    return {}
