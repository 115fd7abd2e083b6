"""The fault kinds and a seeded schedule of them: a replayable list of runs, each with at most
one fault, its moment, and whether the run is asked for while the one before still runs."""

from __future__ import annotations

import random
from dataclasses import dataclass, field, replace

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
    "container_kill": EPOCH,  # a worker's container of the image docker-killed, then started
    "weights_altered": BEFORE,  # the staged weights object truncated or its bytes changed
    "row_group_corrupt": BEFORE,  # bytes of a published dataset's part file changed
    "broken_images": BEFORE,  # new broken files in the image tree
}
# Kinds a soak runs only when asked for (--kinds), since they need what not every machine has:
# a Docker engine and hvdflow's classic image, whose executors hold the classic profile's Python
# (so these stay in the classic profile), as a third worker beside the hosts.
OPT_IN = ("container_kill",)
# The orchestrators a run goes through (tests.soak.faces), and the kinds that strike only one.
PREFECT, AIRFLOW = "prefect", "airflow"
# The profiles a run goes through: the environment its stack runs from (docs/profiles.md).
CLASSIC, CURRENT = "classic", "current"
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
    profile: str = "classic"  # the environment its stack runs from: classic or current
    connect: bool = False  # its Spark is the stack's Spark Connect server (sc://), not a driver


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
    burst_faces: tuple[str, ...] = (PREFECT, AIRFLOW),
    current: int = 0,
    connect: int = 0,
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
    are over, as many through Airflow (when any run goes through it; ``burst_faces`` names the
    orchestrators that get one): each orchestrator must run them in turn, none lost, none
    twice. They come on top of ``runs``.

    ``current``: the last ``current`` of the runs go through the current profile, on a stack of
    its own started after the classic one's runs and bursts are over (``tests.soak.phases``).
    Copy j of the i-th kind goes to the current profile when i + j is odd, so ``each=2`` puts
    one copy of every kind in each profile; PyTorch runs stay in the classic one (the current
    profile has no torch), and so do the bursts. Each profile's first run is its clean one.

    ``connect``: the last ``connect`` of the current profile's runs through Prefect reach Spark
    through a Spark Connect server on the cluster (``launcher.spark_master: sc://...``) instead
    of a driver of their own. The server's application holds every core while it runs, so it
    runs only for them: none of them, and no run after one, is asked for while another run is
    in flight (a driver of its own would get no core; two runs through the server would share
    its application, where one run's barrier stage meets the other's tasks on its slots). Not
    through Airflow: the scoring DAG that a new champion triggers starts a driver of its own on
    the cluster at once, which would get no core while the server runs."""
    kinds = list(kinds or [k for k in FAULT_KINDS if k not in OPT_IN])
    unknown = sorted(set(kinds) - set(FAULT_KINDS))
    if unknown:
        raise ValueError(f"unknown fault kinds {unknown}: expected some of {list(FAULT_KINDS)}")
    before = [k for k in kinds if FAULT_KINDS[k] == BEFORE]
    if not clean_first and before:
        raise ValueError(f"{before} strike before a run: they need a clean first run")
    if not 0 <= current <= runs:
        raise ValueError(f"current={current}: give between 0 and --runs ({runs}) runs")
    if not 0 <= connect <= current:
        raise ValueError(
            f"connect={connect}: give between 0 and --current ({current}) runs: the runs through "
            "Spark Connect are the current profile's (its pyspark has the Connect client)"
        )
    copies = [(i + j, k) for i, k in enumerate(kinds) for j in range(each)]
    faulty = {
        CLASSIC: [k for n, k in copies if not (current and n % 2) or k in OPT_IN],
        CURRENT: [k for n, k in copies if current and n % 2 and k not in OPT_IN],
    }
    sizes = {CLASSIC: runs - current, CURRENT: current}
    clean = 1 if clean_first else 0
    for profile, size in sizes.items():
        if size and size < len(faulty[profile]) + clean:
            where = f" in the {profile} profile" if current else ""
            need = len(faulty[profile]) + clean + (runs - size)
            raise ValueError(
                f"{size} runs{where} cannot hold the {len(faulty[profile])} faulty runs "
                f"({each} of each of {len(kinds)} fault kinds in all)"
                + (" after a first clean run" if clean_first else "")
                + f": give --runs {need} or more"
                + (
                    f" (--current {len(faulty[profile]) + clean} or more)"
                    if profile == CURRENT
                    else ""
                )
                + ", or fewer --kinds"
            )
    forced = sum(FACE_OF_KIND.get(k) == AIRFLOW for k in kinds) * each
    if current and airflow < forced:
        raise ValueError(
            f"airflow={airflow} runs through Airflow cannot hold the {forced} whose fault strikes "
            f"Airflow: give --airflow {forced} or more"
        )
    airflow_current = _airflow_share(faulty, sizes, airflow)
    shares = {CLASSIC: airflow - airflow_current, CURRENT: airflow_current}
    rng = random.Random(seed)
    plan: list[PlannedRun] = []
    for profile in (CLASSIC, CURRENT):
        if sizes[profile] == 0:
            continue
        phase = _phase(
            sizes[profile],
            faulty[profile],
            rng,
            epochs=epochs,
            clean_first=clean_first,
            airflow=shares[profile],
            torch=torch if profile == CLASSIC else 0,
            profile=profile,
            start=len(plan),
        )
        plan += phase
        if profile == CLASSIC:
            faces_used = [f for f in (PREFECT, AIRFLOW) if f in burst_faces]
            if not any(p.face == AIRFLOW for p in plan):
                faces_used = [f for f in faces_used if f != AIRFLOW]
            plan += _bursts(burst, faces_used, start=len(plan))
    return _through_connect(plan, connect)


def _through_connect(plan: list[PlannedRun], connect: int) -> list[PlannedRun]:
    """The plan with the current profile's last ``connect`` runs through Prefect marked
    ``connect``, and neither they nor the run after each asked for while another is in flight."""
    if not connect:
        return plan
    eligible = [i for i, p in enumerate(plan) if p.profile == CURRENT and p.face == PREFECT]
    if len(eligible) < connect:
        raise ValueError(
            f"connect={connect}: the current profile has {len(eligible)} runs through Prefect; "
            "give --connect at most that (runs through Airflow do not go through Connect)"
        )
    chosen = set(eligible[-connect:])
    return [
        replace(p, connect=i in chosen, overlap=p.overlap and not ({i, i - 1} & chosen))
        for i, p in enumerate(plan)
    ]


def _phase(
    size: int,
    faulty: list[str],
    rng: random.Random,
    *,
    epochs: int,
    clean_first: bool,
    airflow: int,
    torch: int,
    profile: str,
    start: int,
) -> list[PlannedRun]:
    """One profile's runs, indexed from ``start``."""
    clean = 1 if clean_first else 0
    rest: list[str | None] = faulty + [None] * (size - len(faulty) - clean)
    rng.shuffle(rest)
    ordered = [None, *rest] if clean_first else rest
    faces = _faces(ordered, airflow, rng)
    if not 0 <= torch <= len(ordered) - clean:
        raise ValueError(f"torch={torch}: give between 0 and {len(ordered) - clean} runs")
    # The clean first run trains TensorFlow: a PyTorch run stages no weights, and a
    # weights_altered fault after it found none to alter (the mixed soak of 2026-11-30).
    with_torch = set(rng.sample(range(clean, len(ordered)), torch))
    plan = []
    for i, fault in enumerate(ordered):
        epoch = rng.randint(2, max(2, epochs - 2))
        delay_s = round(rng.uniform(0.0, 1.0), 2)
        # Faults on what a run reads strike between runs, not under the one before; a run
        # with the container's worker neither overlaps nor is overlapped (it holds a slot).
        overlap = i > 0 and FAULT_KINDS.get(fault, EPOCH) == EPOCH and rng.random() < 0.3
        overlap = overlap and "container_kill" not in (fault, ordered[i - 1])
        plan.append(
            PlannedRun(
                index=start + i,
                fault=fault,
                epoch=epoch,
                delay_s=delay_s,
                overlap=overlap and faces[i] == faces[i - 1] == PREFECT,
                detail=_detail(fault, rng),
                face=faces[i],
                framework="torch" if i in with_torch else "tensorflow",
                profile=profile,
            )
        )
    return plan


def _bursts(burst: int, faces: list[str], start: int) -> list[PlannedRun]:
    plan = []
    for face in faces:
        for i in range(burst):
            plan.append(
                PlannedRun(
                    index=start + len(plan),
                    fault=None,
                    epoch=2,
                    delay_s=0.0,
                    overlap=i > 0,  # the first waits for what runs before; the rest do not
                    face=face,
                    burst=True,
                )
            )
    return plan


def _airflow_share(faulty: dict[str, list[str]], sizes: dict[str, int], airflow: int) -> int:
    """How many of the ``airflow`` runs through Airflow the current profile gets: its share of
    the runs, but at least the runs whose fault strikes Airflow there, and leaving the classic
    profile its own."""
    if not sizes[CURRENT]:
        return 0
    forced = {p: sum(FACE_OF_KIND.get(k) == AIRFLOW for k in faulty[p]) for p in faulty}
    share = round(airflow * sizes[CURRENT] / (sizes[CLASSIC] + sizes[CURRENT]))
    return max(forced[CURRENT], min(share, airflow - forced[CLASSIC]))


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
