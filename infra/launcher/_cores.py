"""Which cores a CPU rank runs on: the ranks of a host split its cores between them.

mpirun binds each rank to its own cores by default (Open MPI: ``--bind-to core`` for up to two
processes); Spark does not, so without this every thread of every rank may run on any core.
On this project's 2-core machine, two one-thread Horovod ranks bound to a core each trained
5.8% more images per second than the same two ranks left to the scheduler (four alternating
rounds, bound ahead in each), the TensorFlow engine's 3.5%, while two plain processes gained
nothing from it (BENCHMARKS.md, "Ranks bound to cores"): a rank's Horovod and Gloo threads
then run on the core of the rank's own TensorFlow thread and never take the other rank's.

The launcher asks for it (HVDFLOW_BIND_TO_CORES=1) on ranks without a GPU; the rank binds itself
first thing, before TensorFlow or Horovod start a thread, so that every thread inherits it.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping

from hvdflow.infra import constants as c


def cores_for(local_rank: int, local_size: int, allowed: Iterable[int]) -> list[int] | None:
    """The cores of rank ``local_rank`` of the ``local_size`` ranks on a host whose processes may
    run on ``allowed``: disjoint, contiguous blocks in core order, the later ranks taking one
    more when the cores do not divide evenly. None when there is nothing to split (one rank) or
    more ranks than cores (any binding would stack ranks on a core; nothing measured that)."""
    cores = sorted(allowed)
    if local_size <= 1 or local_size > len(cores) or not 0 <= local_rank < local_size:
        return None
    n = len(cores)
    return cores[local_rank * n // local_size : (local_rank + 1) * n // local_size]


def bind_this_rank(environ: Mapping[str, str] = os.environ) -> list[int] | None:
    """Bind every thread of this process to its share of the host's cores when the launcher
    asked for it (HVDFLOW_BIND_TO_CORES=1); the cores bound, or None."""
    if environ.get(c.HVDFLOW_BIND_TO_CORES) != "1" or not hasattr(os, "sched_setaffinity"):
        return None
    cores = cores_for(
        int(environ.get(c.HOROVOD_LOCAL_RANK, "0")),
        int(environ.get(c.HOROVOD_LOCAL_SIZE, "1")),
        os.sched_getaffinity(0),
    )
    if cores is None:
        return None
    # Threads inherit the binding of the thread that starts them; any started before this
    # (none in a rank today) are bound one by one.
    for thread_id in os.listdir("/proc/self/task"):
        try:
            os.sched_setaffinity(int(thread_id), cores)
        except (ProcessLookupError, PermissionError):
            continue  # a thread that just ended
    return cores
