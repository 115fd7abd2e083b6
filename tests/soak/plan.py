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
    "scheduler_kill": EPOCH,  # Airflow's scheduler SIGKILLed with its group, started again
    "api_server_kill": EPOCH,  # Airflow's API server (and Execution API) SIGKILLed, restarted
    "disk_full": EPOCH,  # the hosts' /tmp capped at their use for 15 s, over a checkpoint
    "weights_altered": BEFORE,  # the staged weights object truncated or its bytes changed
    "row_group_corrupt": BEFORE,  # bytes of a published dataset's part file changed
    "broken_images": BEFORE,  # new broken files in the image tree
}
# The orchestrators a run goes through (tests.soak.faces), and the kinds that strike only one.
PREFECT, AIRFLOW = "prefect", "airflow"
FACE_OF_KIND = {
    "prefect_restart": PREFECT,
    "worker_kill": PREFECT,
    "scheduler_kill": AIRFLOW,
    "api_server_kill": AIRFLOW,
}


@dataclass(frozen=True)
class PlannedRun:
    index: int
    fault: str | None
    epoch: int  # for an epoch fault: the epoch whose start triggers it
    delay_s: float  # after the trigger, before the fault
    overlap: bool  # asked for while the run before is still in flight
    detail: dict = field(default_factory=dict)  # per kind: which host, how long, which bytes
    face: str = PREFECT  # the orchestrator it is asked for through
    framework: str = "tensorflow"  # training.framework: tensorflow or torch
    burst: bool = False  # one of a burst: asked for at once with the others, fault-free


def make_plan(
    runs: int,
    seed: int,
    kinds: list[str] | None = None,
    *,
    epochs: int,
    each: int = 2,
    clean_first: bool = True,
    airflow: int = 0,
    torch: int = 0,
    burst: int = 0,
) -> list[PlannedRun]:
    """``runs`` runs; each kind of ``kinds`` (default: all) in ``each`` of them at least, the
    rest fault-free; from ``seed`` alone. The first run is fault-free (``clean_first``): it
    builds the dataset and stages the weights the others reuse, and a fault "before" it would
    find nothing to break. Without it, the first run meets its fault while it builds them too,
    which only faults that strike within a run can do.

    ``airflow`` of the runs go through Airflow (those whose kind strikes Airflow first), the
    others through Prefect; a run through Airflow is never asked for while another is in
    flight (the DAG runs one at a time, and Prefect's slots do not see it). ``torch`` of the
    runs, at random, train with PyTorch.

    ``burst``: then that many fault-free runs asked for at once through Prefect, and once those
    are over, as many through Airflow (when any run goes through it): each orchestrator must
    run them in turn, none lost, none twice. They come on top of ``runs``."""
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
    faces = _faces(ordered, airflow, rng)
    if not 0 <= torch <= len(ordered):
        raise ValueError(f"torch={torch}: give between 0 and {len(ordered)} runs")
    with_torch = set(rng.sample(range(len(ordered)), torch))
    plan = []
    for index, fault in enumerate(ordered):
        epoch = rng.randint(2, max(2, epochs - 2))
        delay_s = round(rng.uniform(0.0, 1.0), 2)
        # Faults on what a run reads strike between runs, not under the one before.
        overlap = index > 0 and FAULT_KINDS.get(fault, EPOCH) == EPOCH and rng.random() < 0.3
        plan.append(
            PlannedRun(
                index=index,
                fault=fault,
                epoch=epoch,
                delay_s=delay_s,
                overlap=overlap and faces[index] == faces[index - 1] == PREFECT,
                detail=_detail(fault, rng),
                face=faces[index],
                framework="torch" if index in with_torch else "tensorflow",
            )
        )
    faces_used = [PREFECT] + ([AIRFLOW] if AIRFLOW in faces else [])
    for face in faces_used:
        for i in range(burst):
            plan.append(
                PlannedRun(
                    index=len(plan),
                    fault=None,
                    epoch=2,
                    delay_s=0.0,
                    overlap=i > 0,  # the first waits for what runs before; the rest do not
                    face=face,
                    burst=True,
                )
            )
    return plan


def _faces(ordered: list[str | None], airflow: int, rng: random.Random) -> list[str]:
    """Which runs go through Airflow: those whose fault strikes Airflow, then others at random,
    ``airflow`` in all; ValueError when the kinds ask for more or fewer."""
    forced = {i for i, kind in enumerate(ordered) if FACE_OF_KIND.get(kind) == AIRFLOW}
    free = [i for i, kind in enumerate(ordered) if kind not in FACE_OF_KIND]
    if not len(forced) <= airflow <= len(forced) + len(free):
        raise ValueError(
            f"airflow={airflow} runs through Airflow cannot hold the {len(forced)} whose fault "
            f"strikes Airflow beside the {len(ordered) - len(free) - len(forced)} that strike "
            f"Prefect: give --airflow between {len(forced)} and {len(forced) + len(free)}"
        )
    chosen = forced | set(rng.sample(free, airflow - len(forced)))
    return [AIRFLOW if i in chosen else PREFECT for i in range(len(ordered))]


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
