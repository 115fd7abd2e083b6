"""The engines, one row each (``ENGINES``), and placement: where each rank runs, what it is told.

Placement is pure functions over plain values: every barrier task computes the same plan from the
same task list (``getTaskInfos()`` is ordered by partition id), so the tasks agree on ranks
without talking, and rank 0's task gives its rendezvous the same plan. Rank-side hooks patch on
import: nothing here imports TensorFlow, torch or Horovod.
"""

from __future__ import annotations

import functools
import ipaddress
import json
import os
import re
import site
import socket
import sys
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import psutil

from hvdflow.infra import constants as c
from hvdflow.infra import extras
from hvdflow.infra.constants import TF_CONFIG
from hvdflow.infra.launcher import _rank, _wire
from hvdflow.infra.ports import hold_port

# --- Placement ---


@dataclass(frozen=True)
class GpuPlan:
    """How a run hands out GPUs. ``per_task`` None: a task holding k GPUs runs k ranks, one each
    (HorovodRunner); a tuple: one worker per task using that many of its GPUs (0 hides them).
    ``resource_name``: the Spark resource GPUs are held under. ``driver_gpus``: those ranks on the
    driver may use; None: CUDA_VISIBLE_DEVICES, else every GPU of the machine."""

    per_task: tuple[int, ...] | None = None
    resource_name: str = "gpu"
    driver_gpus: tuple[str, ...] | None = None


@dataclass(frozen=True)
class RankSlot:
    """One rank's place in the job, as Horovod's Gloo controller reads it from the environment."""

    rank: int
    size: int
    local_rank: int
    local_size: int
    cross_rank: int
    cross_size: int
    hostname: str


def host_of(task_address: str) -> str:
    """The host part of a Spark task address such as ``127.0.0.1:40123`` or ``[::1]:40123``."""
    host, _, _port = task_address.rpartition(":")
    return host.strip("[]") if host else task_address


def host_alloc_plan(task_hosts: Sequence[str]) -> list[RankSlot]:
    """Every slot of these hosts (one per task) in rank order, as Horovod's
    ``get_host_assignments`` allocates them: hosts in order of first appearance, each host's
    slots consecutive, the ``cross`` ranks of a local rank counted over the hosts that have one.
    Pure Python, so that runs without Horovod plan alike (test_placement.py compares)."""
    counts = Counter(task_hosts)  # first-appearance order, as dicts keep it
    # cross_ranks[local_rank][host]: the host's index among the hosts with that local rank.
    cross_ranks: dict[int, dict[str, int]] = {}
    for host, slots in counts.items():
        for local_rank in range(slots):
            at_local = cross_ranks.setdefault(local_rank, {})
            at_local[host] = len(at_local)
    plan = []
    for host, slots in counts.items():
        for local_rank in range(slots):
            plan.append(
                RankSlot(
                    rank=len(plan),
                    size=len(task_hosts),
                    local_rank=local_rank,
                    local_size=slots,
                    cross_rank=cross_ranks[local_rank][host],
                    cross_size=len(cross_ranks[local_rank]),
                    hostname=host,
                )
            )
    return plan


def plan_ranks(task_hosts: Sequence[str]) -> list[RankSlot]:
    """The slot of each task, indexed like ``task_hosts`` (by partition id)."""
    by_host_and_local_rank = {(s.hostname, s.local_rank): s for s in host_alloc_plan(task_hosts)}
    seen: Counter[str] = Counter()
    slots = []
    for host in task_hosts:
        slots.append(by_host_and_local_rank[(host, seen[host])])
        seen[host] += 1
    return slots


# Horovod's background thread wakes every HOROVOD_CYCLE_TIME ms (1 by default), on a CPU rank on
# the cores that compute the step: a 10 ms cycle trained two one-thread ranks 11% faster. GPU
# ranks keep the default; horovod.cycle_time_ms or the variable, when set, wins.
CPU_CYCLE_TIME_MS = 10
# Present on a host with an NVIDIA driver (and in containers given its GPUs).
NVIDIA_DEVICE = "/dev/nvidiactl"

# Spark's zipped pyspark and py4j, ahead of site-packages on its Python workers' PYTHONPATH.
_SPARK_ZIPS = re.compile(r"(^|/)(pyspark\.zip|py4j-[^/]*-src\.zip)$")


def rank_python_path(python_path: str, has_pyspark: bool) -> str:
    """A rank's PYTHONPATH: its task's, less Spark's zipped pyspark and py4j when this Python has
    pyspark installed (a rank imports it only for Petastorm's schema types, twice as fast from
    site-packages: a zip holds no bytecode). The rest of the path stays, in order."""
    if not python_path or not has_pyspark:
        return python_path
    kept = [entry for entry in python_path.split(os.pathsep) if not _SPARK_ZIPS.search(entry)]
    return os.pathsep.join(kept)


def has_installed_pyspark() -> bool:
    """Whether this Python's own site-packages hold pyspark."""
    return any(
        os.path.isfile(os.path.join(folder, "pyspark", "__init__.py"))
        for folder in site.getsitepackages()
    )


def rank_env(
    slot: RankSlot,
    *,
    gloo_iface: str,
    options_env: Mapping[str, str],
    run_id: str,
    gpu: str | None = None,
) -> dict[str, str]:
    """What one rank gets on top of its parent's environment: Horovod's variables, its GPU; on a
    CPU rank CPU_CYCLE_TIME_MS and its own cores; the PYTHONPATH without Spark's zips."""
    env = {
        **options_env,
        c.HOROVOD_RANK: str(slot.rank),
        c.HOROVOD_SIZE: str(slot.size),
        c.HOROVOD_LOCAL_RANK: str(slot.local_rank),
        c.HOROVOD_LOCAL_SIZE: str(slot.local_size),
        c.HOROVOD_CROSS_RANK: str(slot.cross_rank),
        c.HOROVOD_CROSS_SIZE: str(slot.cross_size),
        c.HOROVOD_HOSTNAME: slot.hostname,
        c.HOROVOD_CONTROLLER: "gloo",
        c.HOROVOD_CPU_OPERATIONS: "gloo",
        c.HOROVOD_GLOO_IFACE: gloo_iface,
        c.HVDFLOW_RUN_ID: run_id,
    }
    # A choice made in the options wins over the task's GPU: extra_env={"CUDA_VISIBLE_DEVICES":
    # ""} hides the GPUs, on tasks that hold some.
    if gpu is not None and c.CUDA_VISIBLE_DEVICES not in options_env:
        env[c.CUDA_VISIBLE_DEVICES] = gpu
    if gpu is None and not os.path.exists(NVIDIA_DEVICE):
        # CPU defaults, each unless the options or the task's environment chose otherwise.
        for name, value in (
            (c.HOROVOD_CYCLE_TIME, str(CPU_CYCLE_TIME_MS)),
            (c.HVDFLOW_BIND_TO_CORES, "1"),
        ):
            if name not in options_env and name not in os.environ:
                env[name] = value
    task_path = os.environ.get(c.PYTHONPATH)
    if c.PYTHONPATH not in options_env and task_path:
        rank_path = rank_python_path(task_path, has_installed_pyspark())
        if rank_path != task_path:
            env[c.PYTHONPATH] = rank_path
    return env


def tf_config(workers: Sequence[Mapping], rank: int) -> str:
    """TF_CONFIG for worker ``rank``: the cluster's endpoints ordered by rank, so that
    TensorFlow's chief (worker 0) is rank 0, the rank whose result comes back."""
    endpoints = [w["endpoint"] for w in sorted(workers, key=lambda w: int(w["rank"]))]
    return json.dumps(
        {"cluster": {"worker": endpoints}, "task": {"type": "worker", "index": rank}},
        separators=(",", ":"),
    )


def torch_env(
    slot: RankSlot,
    *,
    local_rank: int,
    local_world_size: int,
    group_rank: int,
    group_world_size: int,
    master_addr: str,
    master_port: int,
    run_id: str,
    host_cores: int | None = None,
) -> dict[str, str]:
    """What torchrun sets in each process it starts, for a rank of the torch engine. Each barrier
    task is one torchrun "node" whose ranks share its GPUs, so ``set_device(LOCAL_RANK)`` picks a
    visible one, as in pyspark's TorchDistributor. A CPU rank's OMP_NUM_THREADS, unless set, is
    its share of ``host_cores``: unset, as pyspark leaves it, each rank starts a thread per core."""
    env = {
        c.RANK: str(slot.rank),
        c.WORLD_SIZE: str(slot.size),
        c.LOCAL_RANK: str(local_rank),
        c.LOCAL_WORLD_SIZE: str(local_world_size),
        c.GROUP_RANK: str(group_rank),
        c.GROUP_WORLD_SIZE: str(group_world_size),
        c.ROLE_RANK: str(slot.rank),
        c.ROLE_WORLD_SIZE: str(slot.size),
        c.ROLE_NAME: "default",
        c.MASTER_ADDR: master_addr,
        c.MASTER_PORT: str(master_port),
        c.TORCHELASTIC_RUN_ID: run_id,
        c.TORCHELASTIC_RESTART_COUNT: "0",
        c.TORCHELASTIC_MAX_RESTARTS: "0",
    }
    if host_cores is None:
        host_cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 1
    if c.OMP_NUM_THREADS not in os.environ:
        env[c.OMP_NUM_THREADS] = str(max(1, host_cores // max(1, slot.local_size)))
    return env


def gpu_for_rank(index_in_task: int, gpu_addresses: Sequence[str]) -> str | None:
    """The one GPU a HorovodRunner rank sees: a task's i-th rank its i-th GPU (the driver, np < 0,
    is one task running every rank)."""
    return gpu_addresses[index_in_task % len(gpu_addresses)] if gpu_addresses else None


def worker_gpus(count: int, gpu_addresses: Sequence[str], resource_name: str = "gpu") -> str:
    """CUDA_VISIBLE_DEVICES for a MirroredStrategyRunner worker using ``count`` of its task's
    GPUs: the first (the original samples, these are the same every attempt); 0 hides them."""
    if count > len(gpu_addresses):
        raise ValueError(
            f"this worker needs {count} GPU(s) but its task holds {len(gpu_addresses)} "
            f"({', '.join(gpu_addresses) or 'none'}): check "
            f"spark.task.resource.{resource_name}.amount and the executors' GPUs"
        )
    return ",".join(gpu_addresses[:count])


def gpus_owned(visible: str | None, addresses: Sequence[str]) -> list[str]:
    """The GPUs a task (or the driver) may hand out: CUDA_VISIBLE_DEVICES where the cluster set
    it (Spark's addresses are then not what this process sees, as spark-tensorflow-distributor
    also decides), else the addresses Spark assigned."""
    if visible is not None:
        return [g.strip() for g in visible.split(",") if g.strip()]
    return list(addresses)


def split_evenly(total: int, parts: int) -> list[int]:
    """``total`` over ``parts`` holders, the first ones taking one more: 7 over 3 is 3, 2, 2."""
    return [total // parts + (i < total % parts) for i in range(parts)]


def rank_hosts(task_hosts: Sequence[str], ranks_per_task: Sequence[int] | None) -> list[str]:
    """One host per rank slot: each task's host repeated for its ranks (one each if None), so a
    task's slots are consecutive; ``plan_ranks`` of this list gives each slot its rank."""
    if ranks_per_task is None:
        return list(task_hosts)
    return [host for host, n in zip(task_hosts, ranks_per_task, strict=True) for _ in range(n)]


def gloo_iface_for(host: str) -> str:
    """The interface carrying ``host``'s address here: Gloo binds its pairs to one, and any other
    hangs the full mesh until HOROVOD_GLOO_TIMEOUT_SECONDS."""
    ip = socket.gethostbyname(host)
    for iface, addrs in psutil.net_if_addrs().items():
        if any(a.family == socket.AF_INET and a.address == ip for a in addrs):
            return iface
    if ipaddress.ip_address(ip).is_loopback:
        return "lo"
    raise RuntimeError(
        f"no network interface on {socket.gethostname()} carries {ip} (the executor address "
        f"{host!r}), so Gloo cannot open its connections: set SPARK_LOCAL_IP on the workers to an "
        "address of this machine"
    )


def describe_rank(rank: int, hostname: str, address: str) -> str:
    """How errors name a rank: ``rank 1 on hvd-host2 (10.77.0.12)``, or by address alone."""
    if not hostname or hostname == address:
        return f"rank {rank} on {address}"
    return f"rank {rank} on {hostname} ({address})"


def hostname_problem(
    plan_hosts: Sequence[str], hostname: str, resolved: str | None, address: str
) -> str | None:
    """Why Gloo cannot span hosts from this one, or None. Peers connect to what ``hostname``
    resolves to (``resolved``, None if nothing): a loopback answer (Debian's default 127.0.1.1)
    makes them connect to themselves and abort with ``gloo::IoException ... Connection refused``.
    ``address``: this executor's."""
    if len(set(plan_hosts)) <= 1:
        return None
    if resolved is not None:
        try:
            if not ipaddress.ip_address(resolved).is_loopback:
                return None
        except ValueError:
            pass  # not an address at all: as bad as no answer
        found = f"resolves to {resolved}"
    else:
        found = "does not resolve to any address"
    return (
        f"host {hostname} {found}; Gloo peers on other hosts would be told to connect there: "
        f"map {hostname} to {address} (this executor's address) in /etc/hosts or DNS"
    )


def driver_gpu_addresses() -> list[str]:
    """The GPUs the driver may give its ranks (np < 0): CUDA_VISIBLE_DEVICES, else every one."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return [g for g in visible.split(",") if g.strip()]
    try:
        names = os.listdir("/proc/driver/nvidia/gpus")
    except OSError:
        return []
    return [str(i) for i in range(len(names))]


# --- Cores: a CPU rank's share of its host ---
# mpirun binds each rank to its own cores, Spark does not: bound, two one-thread ranks trained
# 5.8% faster. A CPU rank binds itself (HVDFLOW_BIND_TO_CORES=1) before its threads start.


def cores_for(local_rank: int, local_size: int, allowed: Iterable[int]) -> list[int] | None:
    """Rank ``local_rank``'s cores of ``allowed``, shared by ``local_size`` ranks: disjoint blocks
    in core order, later ranks taking the remainder. None for one rank, or more ranks than cores
    (any binding would stack ranks on a core)."""
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
    # Threads inherit their creator's binding; any started before this are bound one by one.
    for thread_id in os.listdir("/proc/self/task"):
        try:
            os.sched_setaffinity(int(thread_id), cores)
        except (ProcessLookupError, PermissionError):
            continue  # a thread that just ended
    return cores


# --- TensorFlow's distributed datasets, without autotuning ---
# A strategy serves each worker through datasets it builds, autotuning on; deleting their iterator
# (at fit's end, and each epoch's without .repeat()) waits up to a minute for the autotuning
# thread. So a TensorFlow rank turns autotuning off where a dataset's options leave it unset (TF
# 2.15 reaches the datasets a strategy builds only through their builder, which is wrapped).
# Where TensorFlow builds the per-device datasets (TF 2.15's private API: the unit test fails
# first if a TensorFlow upgrade moves it).
DEVICE_DATASETS_MODULE = "tensorflow.python.data.ops.multi_device_iterator_ops"
_MARK = "hvdflow_without_autotuning"
# Where strategies take a user's dataset (``experimental_distribute_dataset``; Keras' fit calls it).
STRATEGIES_MODULE = "tensorflow.python.distribute.distribute_lib"


def wrap_device_datasets(devices) -> None:
    """Wrap ``devices._create_device_dataset`` (``devices``: the module); once per process."""
    build = devices._create_device_dataset
    if getattr(build, _MARK, False):
        return

    def build_without_autotuning(*args, **kwargs):
        import tensorflow as tf  # noqa: PLC0415 (loaded by now: this runs inside the strategy)

        options = tf.data.Options()
        options.autotune.enabled = False
        # Nothing there to optimise; trying says so in a warning at every iterator.
        options.experimental_optimization.apply_default_optimizations = False
        return build(*args, **kwargs).with_options(options)

    setattr(build_without_autotuning, _MARK, True)
    devices._create_device_dataset = build_without_autotuning


def wrap_distributed_datasets(strategies) -> None:
    """Wrap ``StrategyBase.experimental_distribute_dataset`` (``strategies``: the module)."""
    base = strategies.StrategyBase
    distribute = base.experimental_distribute_dataset
    if getattr(distribute, _MARK, False):
        return

    def distribute_without_autotuning(self, dataset, options=None):
        return distribute(self, without_default_autotuning(dataset), options)

    setattr(distribute_without_autotuning, _MARK, True)
    distribute_without_autotuning.__doc__ = distribute.__doc__
    base.experimental_distribute_dataset = distribute_without_autotuning


def without_default_autotuning(dataset):
    """``dataset`` without autotuning when its options leave it unset; otherwise as it is."""
    import tensorflow as tf  # noqa: PLC0415 (loaded by now: a strategy is distributing)

    if not isinstance(dataset, tf.data.Dataset) or dataset.options().autotune.enabled is not None:
        return dataset
    options = tf.data.Options()
    options.autotune.enabled = False
    return dataset.with_options(options)


def device_datasets_without_autotuning() -> None:
    """Wrap the builder in this process now (loads TensorFlow)."""
    import importlib  # noqa: PLC0415

    wrap_device_datasets(importlib.import_module(DEVICE_DATASETS_MODULE))


# --- The engines ---

# Where TensorFlow defines MultiWorkerMirroredStrategy (CollectiveAllReduceStrategy).
_STRATEGY_MODULE = "tensorflow.python.distribute.collective_all_reduce_strategy"
# Where torch defines init_process_group (torch.distributed re-exports it).
_C10D_MODULE = "torch.distributed.distributed_c10d"
# A finished tf_collective worker's wait for the others (the driver's timeouts come long before).
_EXIT_BARRIER_MS = 24 * 3600 * 1000


@dataclass(frozen=True)
class Engine:
    """One engine's row. ``start_point``: what a rank reaches once it joined (the start timeout
    waits for it); ``extra``: the optional install it needs; ``task_env``: sets a task's ranks'
    variables after one exchange between the tasks (None: no exchange), given its ``TaskPlace``;
    ``in_rank``: installed in the rank before ``main`` loads; ``after_main``: run in the rank
    once ``main`` returned."""

    name: str
    start_point: str
    in_rank: Callable[[], None]
    extra: extras.Extra | None = None
    task_env: Callable[..., list[socket.socket]] | None = None
    after_main: Callable[[], None] | None = None


# --- in the rank -------------------------------------------------------------------------


def _reporting_init(original):
    """``original`` (an engine's init), sending EVENT_INIT once it returned; wrapped only once."""
    if getattr(original, "_hvdflow_wrapped", False):
        return original

    @functools.wraps(original)
    def init(*args, **kwargs):
        result = original(*args, **kwargs)
        _wire.emit_event(_wire.EVENT_INIT)
        return result

    init._hvdflow_wrapped = True
    return init


def _report_init_reached() -> None:
    """The horovod engine's start: the rank returned from Horovod's init."""
    from horovod.common import basics

    # Frameworks bind `init = _basics.init` at import, so patch the class before any import.
    basics.HorovodBasics.init = _reporting_init(basics.HorovodBasics.init)


def _report_strategy_created() -> None:
    """The tf_collective engine's start: the rank created a MultiWorkerMirroredStrategy (or its
    ``experimental`` alias), patched on their base class when TensorFlow loads: its import takes
    seconds of CPU that a ``main`` never using it should not pay."""

    def patch(cars) -> None:
        cls = cars.CollectiveAllReduceStrategy
        original = cls.__init__

        def init(self, *args, **kwargs):
            original(self, *args, **kwargs)
            _wire.emit_event(_wire.EVENT_INIT)

        cls.__init__ = init

    _rank.patch_on_import(_STRATEGY_MODULE, patch)


def _report_process_group_initialised() -> None:
    """The torch engine's start: the rank returned from ``init_process_group()``. Patched when
    torch loads, where it is defined and on ``torch.distributed``, which re-exports it."""

    def patch(module) -> None:
        if hasattr(module, "init_process_group"):  # absent where torch has no distributed
            module.init_process_group = _reporting_init(module.init_process_group)

    _rank.patch_on_import(_C10D_MODULE, patch)
    _rank.patch_on_import("torch.distributed", patch)


def _wait_for_the_other_tf_workers() -> None:
    """Hold this tf_collective worker until every worker has returned from main: one done may
    still serve a peer's last collective read, and exiting fails that peer ("Socket closed"). A
    failed barrier means a worker failed, and that worker's own exit reports it."""
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


# The tasks' one exchange: each task's part in, every part back in partition order.
Exchange = Callable[[str], list[str]]


@dataclass(frozen=True)
class TaskPlace:
    """Where a task stands in its run, for its engine's ``task_env``: its partition of
    ``task_count`` tasks, the run's id, and every rank slot's host (``rank_hosts``)."""

    partition: int
    task_count: int
    run_id: str
    rank_hosts: tuple[str, ...]


def _set_tf_configs(ranks: list, all_gather: Exchange, place: TaskPlace) -> list[socket.socket]:
    """TF_CONFIG for each of this task's ranks, from every task's endpoints (one exchange). The
    task holds each rank's port until the ranks end (``hold_port``): the rank binds it after
    TensorFlow's import, and a port only picked may be taken by then ("Could not start gRPC
    server")."""
    held = [hold_port(slot.hostname) for slot, *_ in ranks]
    mine = [
        {"rank": slot.rank, "endpoint": f"{slot.hostname}:{sock.getsockname()[1]}"}
        for (slot, *_), sock in zip(ranks, held, strict=True)
    ]
    workers = [worker for message in all_gather(json.dumps(mine)) for worker in json.loads(message)]
    for slot, _who, env, _link in ranks:
        env[TF_CONFIG] = tf_config(workers, slot.rank)
    return held


def _from_rank_0s_task(
    ranks: list, all_gather: Exchange, start: Callable[[str], tuple[Any, int]]
) -> tuple[list, str, int]:
    """What rank 0's task starts on its host (``start(host)``: the thing to hold until the ranks
    end, and its port), and in every task where: the host and port, through one exchange."""
    first = ranks[0][0]
    held, mine = [], ""
    if first.rank == 0:
        thing, port = start(first.hostname)
        held.append(thing)
        mine = f"{first.hostname}:{port}"
    host, _, port = next(m for m in all_gather(mine) if m).rpartition(":")
    return held, host, int(port)


def _serve_rendezvous(ranks: list, all_gather: Exchange, place: TaskPlace) -> list:
    """Horovod's Gloo rendezvous, served by rank 0's task for every rank host (``_rendezvous``),
    its address in each rank's environment: nothing listens on the driver."""
    from hvdflow.infra.launcher import _rendezvous  # noqa: PLC0415 (Horovod's, loaded here only)

    def serve(host: str) -> tuple[Any, int]:
        hosts = place.rank_hosts
        server = _rendezvous.TaskRendezvous(host, hosts, host_alloc_plan(hosts))
        return server, server.port

    held, host, port = _from_rank_0s_task(ranks, all_gather, serve)
    for _slot, _who, env, _link in ranks:
        env[c.HOROVOD_GLOO_RENDEZVOUS_ADDR] = host
        env[c.HOROVOD_GLOO_RENDEZVOUS_PORT] = str(port)
    return held


def _set_torch_envs(ranks: list, all_gather: Exchange, place: TaskPlace) -> list[socket.socket]:
    """torchrun's environment for each of this task's ranks: the task is a torchrun "node"
    (GROUP_RANK its partition), and every rank meets at the port rank 0's task holds until its
    ranks end (one exchange, as pyspark's): a port only picked may be taken before rank 0's
    TCPStore binds it ("EADDRINUSE"). Returns the held port, for the task to close."""

    def hold(host: str) -> tuple[socket.socket, int]:
        sock = hold_port(host)
        return sock, sock.getsockname()[1]

    held, host, port = _from_rank_0s_task(ranks, all_gather, hold)
    for index, (slot, _who, env, _link) in enumerate(ranks):
        torchrun = torch_env(
            slot,
            local_rank=index,
            local_world_size=len(ranks),
            group_rank=place.partition,
            group_world_size=place.task_count,
            master_addr=host,
            master_port=port,
            run_id=place.run_id,
        )
        # The options' own choices (extra_env) win: a thread count, or the attempt's number.
        env.update({name: value for name, value in torchrun.items() if name not in env})
    return held


def _in_horovod_rank() -> None:
    _report_init_reached()
    # Keras' fit hands a dataset to the default strategy too (autotuning: see above).
    _rank.patch_on_import(STRATEGIES_MODULE, wrap_distributed_datasets)


def _in_tf_collective_rank() -> None:
    _report_strategy_created()
    _rank.patch_on_import(DEVICE_DATASETS_MODULE, wrap_device_datasets)
    _rank.patch_on_import(STRATEGIES_MODULE, wrap_distributed_datasets)


ENGINES = {
    engine.name: engine
    for engine in (
        Engine(
            name=_wire.HOROVOD,
            start_point="hvd.init()",
            extra=extras.HOROVOD,
            task_env=_serve_rendezvous,
            in_rank=_in_horovod_rank,
        ),
        Engine(
            name=_wire.TF_COLLECTIVE,
            start_point="tf.distribute.MultiWorkerMirroredStrategy()",
            extra=extras.TENSORFLOW,
            task_env=_set_tf_configs,
            in_rank=_in_tf_collective_rank,
            after_main=_wait_for_the_other_tf_workers,
        ),
        Engine(
            name=_wire.TORCH,
            start_point="torch.distributed.init_process_group()",
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
        raise ValueError(f"engine={name!r}: expected one of {', '.join(c.ENGINES)}") from None
