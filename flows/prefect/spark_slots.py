"""One cluster, shared in turn: Prefect's global concurrency limit ``spark-slots``.

A barrier stage needs all of its tasks at once. Two flows that train (or train and score) on one
cluster at the same time would compete for its task slots, and the second would fail after the
launcher's ``slot_wait_s``. Each step that uses the cluster holds slots of this limit instead:
training its np, scoring and the benchmark the whole cluster (scoring spreads over every core;
the benchmark's timings must not share the machine). A flow that finds them taken waits its
turn, says so in its log, and Prefect's UI shows the limit's slots in use (Concurrency page).

The limit is created at its first use, sized to the cluster's task slots then; an operator may
change it (``prefect gcl update spark-slots --limit N``) and hvdflow keeps what they set. A flow
that dies holding slots gives them back when its lease runs out (Prefect renews it while the
holder lives).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

from prefect.client.orchestration import get_client
from prefect.client.schemas.actions import GlobalConcurrencyLimitCreate
from prefect.concurrency.sync import concurrency
from prefect.exceptions import ObjectAlreadyExists, ObjectNotFound

# The launcher's own count of what a barrier stage may use: the same number it checks np against.
from hvdflow.infra.launcher._driver import task_slots

SPARK_SLOTS = "spark-slots"
# Waits shorter than this are not worth a line.
QUIET_WAIT_S = 1.0


def slots_limit(cluster_slots: int) -> int:
    """The limit in force, created with ``cluster_slots`` when there is none yet. Two flows
    that start together may both find none: the one whose create loses reads the winner's."""
    with get_client(sync_client=True) as client:
        try:
            return client.read_global_concurrency_limit_by_name(SPARK_SLOTS).limit
        except ObjectNotFound:
            pass
        try:
            client.create_global_concurrency_limit(
                GlobalConcurrencyLimitCreate(name=SPARK_SLOTS, limit=cluster_slots)
            )
            return cluster_slots
        except ObjectAlreadyExists:
            return client.read_global_concurrency_limit_by_name(SPARK_SLOTS).limit


@contextmanager
def spark_slots(spark, occupy: int | None, what: str, logger) -> Iterator[None]:
    """Hold ``occupy`` slots of ``spark-slots`` (None: the whole cluster) while the block runs;
    ``occupy`` <= 0 (ranks on the driver) holds none."""
    if occupy is not None and occupy <= 0:
        yield
        return
    # Not countable through Spark Connect to a cluster: what this run needs founds the limit.
    cluster = max(task_slots(spark) or 0, occupy or 1)
    limit = slots_limit(cluster)
    wanted = limit if occupy is None else occupy
    if wanted > limit:
        raise ValueError(
            f"{what} needs {wanted} slots of the Prefect concurrency limit {SPARK_SLOTS!r}, "
            f"which allows {limit}: raise it (`prefect gcl update {SPARK_SLOTS} --limit "
            f"{wanted}`) if the cluster has grown, or lower np"
        )
    logger.info(
        "%s takes %d of the %d %r slots (a Prefect global concurrency limit); it waits while "
        "other flows hold them",
        what,
        wanted,
        limit,
        SPARK_SLOTS,
    )
    asked = time.monotonic()
    with concurrency(SPARK_SLOTS, occupy=wanted, strict=True):
        waited = time.monotonic() - asked
        if waited >= QUIET_WAIT_S:
            logger.info("%s waited %.0f s for its turn on the cluster", what, waited)
        yield
