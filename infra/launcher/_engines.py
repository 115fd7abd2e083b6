"""The launcher's engines, one row each: what the driver, each task and each rank do
differently by engine, read from the row instead of comparing the engine's name.

- ``horovod``: Horovod over Gloo; the driver serves Horovod's rendezvous, a rank has joined at
  ``hvd.init()``.
- ``tf_collective``: TensorFlow's MultiWorkerMirroredStrategy; the tasks exchange their
  workers' endpoints for TF_CONFIG, a rank has joined when it creates the strategy, and a
  finished worker waits for the others before it exits.
- ``torch``: torch.distributed; the tasks agree on rank 0's address for torchrun's variables, a
  rank has joined at ``init_process_group()``.

Rank-side hooks patch on import (``_patching``): nothing here imports TensorFlow, torch or
Horovod.
"""

from __future__ import annotations

import json
import socket
import sys
from collections.abc import Callable
from dataclasses import dataclass

from hvdflow.infra import extras
from hvdflow.infra.constants import TF_CONFIG
from hvdflow.infra.launcher import _placement, _wire, tf_datasets
from hvdflow.infra.launcher._patching import patch_on_import
from hvdflow.infra.launcher.rank_events import emit_event
from hvdflow.infra.ports import hold_port

# Where TensorFlow defines MultiWorkerMirroredStrategy (CollectiveAllReduceStrategy).
_STRATEGY_MODULE = "tensorflow.python.distribute.collective_all_reduce_strategy"
# Where torch defines init_process_group (torch.distributed re-exports it).
_C10D_MODULE = "torch.distributed.distributed_c10d"
# How long a tf_collective worker that finished waits for the others to finish (the driver's own
# timeouts stop a run that hangs long before this).
_EXIT_BARRIER_MS = 24 * 3600 * 1000


@dataclass(frozen=True)
class Engine:
    """One engine's row. ``start_point``: what a rank has reached once it joined the job (the
    start timeout waits for it); ``rendezvous``: the driver serves Horovod's Gloo rendezvous;
    ``extra``: the optional install it needs (None: none); ``task_env``: sets each of a task's
    ranks' variables after one exchange between the tasks (``ranks, all_gather, partition,
    task_count, run_id``), None where nothing is exchanged; ``in_rank``: installed in the rank
    before ``main`` loads (reports the join, ...); ``after_main``: run in the rank once
    ``main`` returned."""

    name: str
    start_point: str
    rendezvous: bool
    extra: extras.Extra | None
    task_env: Callable[..., list[socket.socket]] | None
    in_rank: Callable[[], None]
    after_main: Callable[[], None] | None = None


# --- in the rank -------------------------------------------------------------------------


def _report_init_reached() -> None:
    """Wrap Horovod's init so the supervisor knows this rank joined the job (start timeout)."""
    from horovod.common import basics

    original = basics.HorovodBasics.init
    if getattr(original, "_hvdflow_wrapped", False):
        return

    def init(self, *args, **kwargs):
        result = original(self, *args, **kwargs)
        emit_event(_wire.EVENT_INIT)
        return result

    init._hvdflow_wrapped = True
    # Frameworks bind `init = _basics.init` at import, so patch the class before any import.
    basics.HorovodBasics.init = init


def _report_strategy_created() -> None:
    """The tf_collective engine's start: the rank created its MultiWorkerMirroredStrategy.

    Patched on the base class of ``tf.distribute.MultiWorkerMirroredStrategy`` (and of its
    deprecated ``experimental`` alias) when TensorFlow loads it, so that any code creating one
    counts. Not imported here: TensorFlow takes seconds of CPU to import, and a function that
    never uses it (a launcher check, a GPU-placement probe) should not pay for it.
    """

    def patch(cars) -> None:
        cls = cars.CollectiveAllReduceStrategy
        original = cls.__init__

        def init(self, *args, **kwargs):
            original(self, *args, **kwargs)
            emit_event(_wire.EVENT_INIT)

        cls.__init__ = init

    patch_on_import(_STRATEGY_MODULE, patch)


def _report_process_group_initialised() -> None:
    """The torch engine's start: the rank returned from ``init_process_group()``.

    Patched where torch defines it when torch loads; ``torch.distributed`` re-exports the
    module's function at import, so the package's name is patched too. Not imported here, for
    the same reason as TensorFlow above (torch's import takes a second of CPU).
    """

    def wrap(original):
        if getattr(original, "_hvdflow_wrapped", False):
            return original

        def init_process_group(*args, **kwargs):
            result = original(*args, **kwargs)
            emit_event(_wire.EVENT_INIT)
            return result

        init_process_group._hvdflow_wrapped = True
        return init_process_group

    def patch_c10d(module) -> None:
        module.init_process_group = wrap(module.init_process_group)

    def patch_package(module) -> None:
        if hasattr(module, "init_process_group"):  # absent where torch has no distributed
            module.init_process_group = wrap(module.init_process_group)

    patch_on_import(_C10D_MODULE, patch_c10d)
    patch_on_import("torch.distributed", patch_package)


def _wait_for_the_other_tf_workers() -> None:
    """Hold this tf_collective worker until every worker has returned from main.

    TensorFlow's collectives pull each tensor from the worker that holds it: a worker that has
    its own result may still be serving a peer's last read. Exiting then fails that peer with
    "Socket closed" (seen in CI at the final gather). The coordination service's barrier
    releases the workers together; without a strategy (main made none) there is nothing to wait
    for. A barrier that fails means a worker failed, and that worker's own exit reports it.
    """
    if "tensorflow" not in sys.modules:
        return  # main never loaded TensorFlow, so it made no strategy
    from tensorflow.python.eager import context

    if context.context().coordination_service is None:
        return
    try:
        context.context().wait_at_barrier("hvdflow_main_returned", _EXIT_BARRIER_MS)
    except Exception as e:  # noqa: BLE001 (this worker's own work is done)
        print(f"hvdflow: not every worker reached the end of main: {e}", file=sys.stderr)


# --- in the task -------------------------------------------------------------------------


def _set_tf_configs(
    ranks: list,
    all_gather: Callable[[str], list[str]] | None,
    partition: int,
    task_count: int,
    run_id: str,
) -> list[socket.socket]:
    """TF_CONFIG for each of this task's ranks, from every task's endpoints (one exchange).

    Each rank's TensorFlow server listens on a port this task holds for it until the ranks end
    (``hold_port``): the rank binds it seconds later, after TensorFlow's import. A port only
    picked may be taken meanwhile ("Could not start gRPC server"); spark-tensorflow-distributor
    takes whatever ``bind(0)`` gives, from the range outgoing connections draw from too.
    """
    if all_gather is None:
        raise RuntimeError("the tf_collective engine needs the tasks' all_gather")
    held = [hold_port(slot.hostname) for slot, *_ in ranks]
    mine = [
        {"rank": slot.rank, "endpoint": f"{slot.hostname}:{sock.getsockname()[1]}"}
        for (slot, *_), sock in zip(ranks, held, strict=True)
    ]
    workers = [worker for message in all_gather(json.dumps(mine)) for worker in json.loads(message)]
    for slot, _who, env, _link in ranks:
        env[TF_CONFIG] = _placement.tf_config(workers, slot.rank)
    return held


def _set_torch_envs(
    ranks: list,
    all_gather: Callable[[str], list[str]] | None,
    partition: int,
    task_count: int,
    run_id: str,
) -> list[socket.socket]:
    """torchrun's environment for each of this task's ranks: the task is a torchrun "node"
    (GROUP_RANK its partition), its ranks that node's local processes, and every rank meets at
    the port rank 0's task reserved (one exchange, as pyspark's TorchDistributor does).

    Rank 0's task holds that port until its ranks end (``hold_port``): rank 0's TCPStore binds
    it seconds later, after torch's import, and a port only picked was once taken meanwhile
    ("EADDRINUSE" from rank 0, CI of 2026-11-29). Returns it, for the task to close.
    """
    if all_gather is None:
        raise RuntimeError("the torch engine needs the tasks' all_gather")
    first = ranks[0][0]
    master = ""
    held = []
    if first.rank == 0:
        held.append(hold_port(first.hostname))
        master = f"{first.hostname}:{held[0].getsockname()[1]}"
    master = next(m for m in all_gather(master) if m)
    host, _, port = master.rpartition(":")
    for index, (slot, _who, env, _link) in enumerate(ranks):
        torchrun = _placement.torch_env(
            slot,
            local_rank=index,
            local_world_size=len(ranks),
            group_rank=partition,
            group_world_size=task_count,
            master_addr=host,
            master_port=int(port),
            run_id=run_id,
        )
        # The options' own choices (extra_env) win: a thread count, or the attempt's number.
        env.update({name: value for name, value in torchrun.items() if name not in env})
    return held


def _in_horovod_rank() -> None:
    _report_init_reached()
    # Keras' fit hands a user's dataset to the default strategy too: each epoch over a dataset
    # without repeat() would wait up to a minute for tf.data's autotuning thread (tf_datasets).
    patch_on_import(tf_datasets.STRATEGIES_MODULE, tf_datasets.wrap_distributed_datasets)


def _in_tf_collective_rank() -> None:
    _report_strategy_created()
    # fit's end, and each epoch's over a dataset without repeat(), would wait up to a minute
    # for tf.data's autotuning thread (tf_datasets).
    patch_on_import(tf_datasets.DEVICE_DATASETS_MODULE, tf_datasets.wrap_device_datasets)
    patch_on_import(tf_datasets.STRATEGIES_MODULE, tf_datasets.wrap_distributed_datasets)


ENGINES = {
    engine.name: engine
    for engine in (
        Engine(
            name=_wire.HOROVOD,
            start_point="hvd.init()",
            rendezvous=True,
            extra=extras.HOROVOD,
            task_env=None,
            in_rank=_in_horovod_rank,
        ),
        Engine(
            name=_wire.TF_COLLECTIVE,
            start_point="tf.distribute.MultiWorkerMirroredStrategy()",
            rendezvous=False,
            extra=None,
            task_env=_set_tf_configs,
            in_rank=_in_tf_collective_rank,
            after_main=_wait_for_the_other_tf_workers,
        ),
        Engine(
            name=_wire.TORCH,
            start_point="torch.distributed.init_process_group()",
            rendezvous=False,
            extra=None,
            task_env=_set_torch_envs,
            in_rank=_report_process_group_initialised,
        ),
    )
}


def engine(name: str) -> Engine:
    """The row of engine ``name`` (``_wire.HOROVOD``, ``TF_COLLECTIVE`` or ``TORCH``)."""
    try:
        return ENGINES[name]
    except KeyError:
        raise ValueError(f"engine={name!r}: expected one of {sorted(ENGINES)}") from None
