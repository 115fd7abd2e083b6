"""The task supervisor: one Spark barrier task (or, for ``np < 0``, a thread of the driver) starts
its rank processes (one per GPU where the task holds several), streams their output to the
driver, and stops them when told.

A rank is a new interpreter in its own process group, which the task kills as a whole; it asks
to die with its task (``_rank``). A task that hears nothing from the driver for
``heartbeat_timeout_s`` (a cut network closes nothing) kills its rank too.
"""

from __future__ import annotations

import collections
import contextlib
import functools
import json
import os
import re
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from hvdflow.infra.constants import (
    CUDA_VISIBLE_DEVICES,
    HVDFLOW_ENGINE,
    HVDFLOW_EVENT_FD,
    HVDFLOW_PARENT_PID,
    HVDFLOW_STACKS_FILE,
    HVDFLOW_TASK_CONTEXT,
    HVDFLOW_TASK_CONTEXT_FD,
)
from hvdflow.infra.launcher import _decisions, _engines, _rank, _relay, _wire, errors

# A rank's folder goes with its task; one killed with its executor cannot remove it, so each
# new task removes those of ended tasks, by pid *and* host (a container has pids of its own).
PREFIX = "hvdflow-rank"
_OWNER = re.compile(rf"^{PREFIX}\d+-pid(\d+)@(.+)-[a-z0-9_]{{8}}$")  # tempfile's random part


@contextlib.contextmanager
def rank_workdir(rank: int) -> Iterator[str]:
    remove_orphans()
    prefix = f"{PREFIX}{rank}-pid{os.getpid()}@{socket.gethostname()}-"
    with tempfile.TemporaryDirectory(prefix=prefix) as path:
        yield path


def remove_orphans(base: str | None = None) -> list[str]:
    """Remove the rank folders in ``base`` (the temporary folder) of ended tasks; the paths."""
    base = base or tempfile.gettempdir()
    here = socket.gethostname()
    removed = []
    with contextlib.suppress(OSError):
        for name in os.listdir(base):
            owner = _OWNER.match(name)
            if owner and owner.group(2) == here and not _alive(int(owner.group(1))):
                shutil.rmtree(os.path.join(base, name), ignore_errors=True)
                removed.append(os.path.join(base, name))
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        pass
    return True


# ship(stream, text, at=None): one line to the driver, stamped ``at`` or when it was read.
Ship = Callable[..., None]
NoteProgress = Callable[[int, int, bool], None]


def start_readers(
    proc: subprocess.Popen,
    events_fd: int,
    ship: Ship,
    init_reached: threading.Event,
    note_progress: NoteProgress,
) -> list[threading.Thread]:
    """Start reading ``proc``'s stdout, stderr and event pipe; each thread ends at its EOF."""
    readers = [
        threading.Thread(target=_pump_stdout, args=(proc.stdout, ship), daemon=True),
        threading.Thread(target=_pump_stderr, args=(proc.stderr, ship), daemon=True),
        threading.Thread(
            target=_pump_events, args=(events_fd, init_reached, note_progress), daemon=True
        ),
    ]
    for t in readers:
        t.start()
    return readers


def _pump_stdout(pipe, ship: Ship) -> None:
    while (line := _wire.read_line(pipe, _wire.MAX_LINE_BYTES)) is not None:
        kept, total = line
        printed, message = _wire.split_log_line(kept)
        if message is None:
            ship(_wire.STDOUT, _wire.line_text(kept, total))
            continue
        if printed:
            ship(_wire.STDOUT, _wire.line_text(printed, len(printed)))
        ship(_wire.CALLBACK, *message)
    pipe.close()


def _pump_stderr(pipe, ship: Ship) -> None:
    while (line := _wire.read_line(pipe, _wire.MAX_LINE_BYTES)) is not None:
        ship(_wire.STDERR, _wire.line_text(*line))
    pipe.close()


class Reached(threading.Event):
    """Set when the rank reached its engine's start; ``at``: when (monotonic), not when polled."""

    at: float | None = None

    def set(self) -> None:
        if self.at is None:
            self.at = time.monotonic()
        super().set()


def _pump_events(fd: int, init_reached: threading.Event, note_progress: NoteProgress) -> None:
    with os.fdopen(fd, "rb") as events:
        while (line := _wire.read_line(events, _wire.MAX_MESSAGE_BYTES)) is not None:
            raw, total = line
            if total > len(raw):
                continue  # events are short, so only a stray writer gets here
            try:
                event = json.loads(raw)
            except ValueError:
                continue
            if not isinstance(event, dict):
                continue
            if event.get("event") == _wire.EVENT_INIT:
                init_reached.set()
                note_progress(0, 0, True)  # the stall watch starts at hvd.init()
            elif event.get("event") == _wire.EVENT_PROGRESS:
                note_progress(
                    int(event.get("begun", 0)),
                    int(event.get("finished", 0)),
                    bool(event.get("watch", True)),
                )


# BarrierTaskContext in a rank (spark-tensorflow-distributor's functions call it): the task makes
# the rank's ``barrier`` and ``allGather`` calls on its own context; the rest is a snapshot. A
# task of several ranks serves none: barrier mode could not tell their calls apart.
BARRIER, ALL_GATHER = "barrier", "allGather"
_TASKCONTEXT_MODULE = "pyspark.taskcontext"


def snapshot(ctx) -> dict[str, Any]:
    """What a ``BarrierTaskContext`` answers without asking anyone, as plain JSON values."""
    return {
        "stage_id": ctx.stageId(),
        "partition_id": ctx.partitionId(),
        "attempt_number": ctx.attemptNumber(),
        "task_attempt_id": ctx.taskAttemptId(),
        "cpus": ctx.cpus(),
        "local_properties": dict(ctx._localProperties or {}),  # no public getter for all
        "resources": {name: list(info.addresses) for name, info in ctx.resources().items()},
        "task_addresses": [info.address for info in ctx.getTaskInfos()],
    }


class TaskContextServer:
    """The task's side: one socket pair per rank, answered by a thread until the rank ends."""

    def __init__(self, ctx):
        self._ctx = ctx
        self._snapshot = json.dumps(snapshot(ctx))

    def start(self) -> tuple[dict[str, str], int, _Pair]:
        task_end, rank_end = socket.socketpair()
        threading.Thread(
            target=self._serve, args=(task_end,), daemon=True, name="hvdflow-task-context"
        ).start()
        fd = rank_end.fileno()
        env = {HVDFLOW_TASK_CONTEXT_FD: str(fd), HVDFLOW_TASK_CONTEXT: self._snapshot}
        return env, fd, _Pair(task_end, rank_end)

    def _serve(self, sock: socket.socket) -> None:
        conn = _wire.Connection(sock)
        while (request := conn.receive()) is not None:
            try:
                if request.get("op") == BARRIER:
                    self._ctx.barrier()
                    reply: dict[str, Any] = {"ok": True}
                elif request.get("op") == ALL_GATHER:
                    reply = {"messages": self._ctx.allGather(str(request.get("message", "")))}
                else:
                    reply = {"error": f"unknown request {request.get('op')!r}"}
            except Exception as e:  # noqa: BLE001 (the rank raises it where the user called)
                reply = {"error": f"{type(e).__name__}: {e}"}
            try:
                conn.send(reply)
            except OSError:
                return  # the rank is gone


class _Pair:
    """A rank's socket pair: ``rank_started`` once the rank has its end, ``close`` after."""

    def __init__(self, task_end: socket.socket, rank_end: socket.socket):
        self._task_end, self._rank_end = task_end, rank_end

    def rank_started(self) -> None:
        self._rank_end.close()

    def close(self) -> None:
        for end in (self._rank_end, self._task_end):
            with contextlib.suppress(OSError):
                end.close()


def install_in_rank(patch_on_import) -> None:
    """In the rank: serve ``BarrierTaskContext.get()`` once pyspark is imported, if passed one."""
    fd = os.environ.get(HVDFLOW_TASK_CONTEXT_FD)
    info = os.environ.get(HVDFLOW_TASK_CONTEXT)
    if not fd or not info:
        return
    link = _RankLink(int(fd))
    values = json.loads(info)

    def patch(taskcontext) -> None:
        context = _context_class(taskcontext)(values, link)
        # Where a Spark worker puts its barrier task's context, so both get()s find it.
        taskcontext.TaskContext._setTaskContext(context)
        taskcontext.BarrierTaskContext._taskContext = context

    patch_on_import(_TASKCONTEXT_MODULE, patch)


class _RankLink:
    """The rank's end: one request at a time, each answered before the next is sent."""

    def __init__(self, fd: int):
        self._conn = _wire.Connection(socket.socket(fileno=fd))
        self._lock = threading.Lock()

    def ask(self, request: dict[str, Any]) -> dict[str, Any]:
        with self._lock:
            self._conn.send(request)
            reply = self._conn.receive()
        if reply is None:
            raise RuntimeError(
                f"BarrierTaskContext.{request['op']}: the Spark task that runs this rank closed "
                "the connection (the run is stopping)"
            )
        if "error" in reply:
            raise RuntimeError(
                f"BarrierTaskContext.{request['op']} failed in the Spark task: {reply['error']}"
            )
        return reply


def _context_class(taskcontext):
    """A factory of contexts that answer from ``values`` and ask the task through ``link``."""
    from pyspark.resource import ResourceInformation  # noqa: PLC0415, TID253 (pyspark is loaded)

    class RankBarrierTaskContext(taskcontext.BarrierTaskContext):
        def __init__(self, values: dict[str, Any], link: _RankLink):
            self._stageId = values["stage_id"]
            self._partitionId = values["partition_id"]
            self._attemptNumber = values["attempt_number"]
            self._taskAttemptId = values["task_attempt_id"]
            self._cpus = values["cpus"]
            self._localProperties = values["local_properties"]
            self._resources = {
                name: ResourceInformation(name, addresses)
                for name, addresses in values["resources"].items()
            }
            self._addresses = values["task_addresses"]
            self._link = link

        def barrier(self) -> None:
            self._link.ask({"op": BARRIER})

        def allGather(self, message: str = "") -> list[str]:
            if not isinstance(message, str):
                raise TypeError("Argument `message` must be of type `str`")
            return self._link.ask({"op": ALL_GATHER, "message": message})["messages"]

        def getTaskInfos(self) -> list:
            return [taskcontext.BarrierTaskInfo(address) for address in self._addresses]

    # TaskContext.__new__ hands out the singleton: build this one without it.
    def create(values, link):
        context = object.__new__(RankBarrierTaskContext)
        context.__init__(values, link)
        return context

    return create


RANK_MODULE = "hvdflow.infra.launcher._rank"
# How long a task waits to connect to the driver; RELAY_AFTER_S with a relay to fall back on.
CONNECT_TIMEOUT_S = 30.0
RELAY_AFTER_S = 5.0
# How long a task waits for the driver to accept the plan, and for the exchange's parts.
PLAN_TIMEOUT_S = 60.0
GATHER_TIMEOUT_S = 300.0
_POLL_S = 0.1
STACKS_WAIT_S = 1.0  # for the rank's faulthandler to write its stacks before they are read


@dataclass(frozen=True)
class TaskSpec:
    """Everything a task needs, as plain values: it travels to executors in the closure."""

    payload: bytes
    driver_host: str
    driver_port: int
    token: str
    options_env: Mapping[str, str]
    run_id: str
    start_timeout_s: float
    heartbeat_timeout_s: float = _wire.DEFAULT_HEARTBEAT_TIMEOUT_S
    engine: str = _wire.HOROVOD
    # Ranks per task, by partition: a task holding k GPUs runs k. None: one rank per task.
    ranks_per_task: tuple[int, ...] | None = None
    # GPUs each task's one worker uses (MirroredStrategyRunner; 0 hides them). None: one per rank.
    gpus_per_task: tuple[int, ...] | None = None
    gpu_resource_name: str = "gpu"  # the Spark resource the tasks hold their GPUs under
    relay: _relay.RelaySpec | None = None  # None: the run offers no object store relay


class DriverLink:
    """This task's connection to the driver; a close from the driver means abort. It sends a
    heartbeat every HEARTBEAT_INTERVAL_S and notes when it last heard the driver (``lost()``)."""

    def __init__(self, spec: TaskSpec, slot: int):
        # The rank's progress, sent with every heartbeat once it has reached hvd.init().
        self.progress: dict | None = None
        self.stacks_requested = threading.Event()
        self.conn, relayed = _connect(spec, slot)
        self.aborted = threading.Event()
        self._stuck = threading.Event()  # a send timed out: the driver stopped reading
        self._closed = threading.Event()
        self.heartbeat_timeout_s = spec.heartbeat_timeout_s
        self.last_heard = time.monotonic()
        hello = {
            "type": _wire.HELLO,
            "token": spec.token,
            # The rank slot's index in the plan: how the driver names a rank before it has one.
            "partition": slot,
            "hostname": socket.gethostname()[: _wire.MAX_HOSTNAME_CHARS],
            **({"relayed": relayed} if relayed else {}),  # why, for the driver's log
        }
        try:
            self.conn.send(hello)
        except OSError as e:  # the relay's object store, away
            raise errors.RankFailed(
                f"rank slot {slot} could not say hello to the driver: {e}"
            ) from None
        self._replies: collections.deque = collections.deque()
        self._reply_ready = threading.Condition()
        threading.Thread(target=self._read, daemon=True, name="hvdflow-driver-link").start()
        threading.Thread(target=self._beat, daemon=True, name="hvdflow-heartbeat").start()

    def _read(self) -> None:
        while True:
            message = self.conn.receive()
            self.last_heard = time.monotonic()
            if message is None:
                self.aborted.set()
                with self._reply_ready:
                    self._reply_ready.notify_all()
                return
            if message.get("type") == _wire.HEARTBEAT:
                continue  # its arrival is all it says
            if message.get("type") == _wire.DUMP_STACKS:
                self.stacks_requested.set()
                continue
            with self._reply_ready:
                self._replies.append(message)
                self._reply_ready.notify_all()

    def _beat(self) -> None:
        while not self._closed.wait(_wire.HEARTBEAT_INTERVAL_S):
            progress = self.progress
            self.send({"type": _wire.HEARTBEAT, **({"progress": progress} if progress else {})})

    def lost(self) -> bool:
        """Whether the driver has been silent, or unable to read, for heartbeat_timeout_s."""
        silent = _decisions.is_overdue(self.last_heard, time.monotonic(), self.heartbeat_timeout_s)
        return silent or self._stuck.is_set()

    def send(self, message: dict) -> None:
        """Best effort: shipping output must never fail training."""
        try:
            self.conn.send(message)
        except BlockingIOError:  # SO_SNDTIMEO passed: nothing was read for heartbeat_timeout_s
            self._stuck.set()
        except OSError:
            pass

    def request_plan(self, hosts: Sequence[str]) -> None:
        self.conn.send({"type": _wire.PLAN, "hosts": list(hosts)})
        self._reply(_wire.PLAN_OK, "accepted the rank plan", PLAN_TIMEOUT_S, "PLAN_TIMEOUT_S")

    def all_gather(self, part: str, partition: int, tasks: int) -> list[str]:
        """Every task's ``part``, in partition order, exchanged through the driver."""
        self.conn.send({"type": _wire.GATHER, "partition": partition, "tasks": tasks, "part": part})
        reply = self._reply(
            _wire.GATHERED, "gathered every task's part", GATHER_TIMEOUT_S, "GATHER_TIMEOUT_S"
        )
        return list(reply["parts"])

    def _reply(self, kind: str, what: str, timeout_s: float, setting: str) -> dict:
        """The driver's reply of type ``kind``; RankFailed if it closes or ``timeout_s`` passes."""
        deadline = time.monotonic() + timeout_s
        with self._reply_ready:
            while (
                reply := next((m for m in self._replies if m.get("type") == kind), None)
            ) is None:
                if self.aborted.is_set():
                    raise errors.RankFailed(
                        f"the driver closed the connection before it {what}: "
                        "the run was cancelled, or the driver stopped"
                    )
                left = deadline - time.monotonic()
                if left <= 0:
                    raise errors.RankFailed(
                        f"the driver had not {what} within {timeout_s:g} s "
                        f"(hvdflow.infra.launcher._task.{setting}); "
                        "is the driver still running?"
                    )
                if self.lost():  # a driver gone silently answers nothing: no need to wait on
                    raise errors.RankFailed(
                        f"heard nothing from the driver for {self.heartbeat_timeout_s:g} s "
                        f"before it {what} (heartbeat_timeout_s): the driver, or the network to "
                        "it, is gone"
                    )
                self._reply_ready.wait(min(left, _wire.HEARTBEAT_INTERVAL_S))
            self._replies.remove(reply)
            return reply

    def close(self) -> None:
        """Say bye (this task ends on its own, it did not die), then close."""
        self._closed.set()
        self.send({"type": _wire.BYE})
        self.conn.close()


def _connect(spec: TaskSpec, slot: int) -> tuple[_wire.Connection | _relay.TaskRelay, str | None]:
    """The direct connection, else the relay where the run offers one; and why the relay."""
    relay = spec.relay
    if relay is not None and relay.always:
        why = "the run asked for the relay (LaunchOptions relay='always')"
        return _relay.TaskRelay(relay, slot), why
    address = (spec.driver_host, spec.driver_port)
    # With a relay, give the direct channel less time: a firewall that drops it costs every run.
    timeout_s = CONNECT_TIMEOUT_S if relay is None else RELAY_AFTER_S
    try:
        sock = socket.create_connection(address, timeout=timeout_s)
    except OSError as e:
        if relay is not None:
            return _relay.TaskRelay(relay, slot), (
                f"{socket.gethostname()} could not connect to {address[0]}:{address[1]} "
                f"within {timeout_s:g} s: {e}"
            )
        raise errors.RankFailed(
            f"rank slot {slot} could not reach the driver at {address[0]}:{address[1]} "
            f"within {timeout_s:g} s "
            f"(hvdflow.infra.launcher._task.CONNECT_TIMEOUT_S): {e}. "
            "Executors must reach that address (spark.driver.host on a classic session; "
            "through Spark Connect, $SPARK_LOCAL_IP or the client's address toward the "
            "server): set it to one they can route to, or let the ranks reach the driver "
            "through the object store: name one (AWS_ENDPOINT_URL or HVDFLOW_BUCKET) and keep "
            "LaunchOptions relay='auto' (the tf_collective and torch engines)"
        ) from None
    sock.settimeout(None)
    # A send stuck for heartbeat_timeout_s gives the driver up (lost()) rather than block a
    # thread, and its lock, forever.
    seconds = spec.heartbeat_timeout_s
    timeval = struct.pack("ll", int(seconds), int(seconds % 1 * 1e6))
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, timeval)
    return _wire.Connection(sock), None


def run_task(
    spec: TaskSpec,
    partition: int,
    task_hosts: Sequence[str],
    gpu_addresses: Sequence[str] = (),
    all_gather: Callable[[str], list[str]] | None = None,
    task_context: TaskContextServer | None = None,
) -> bytes | None:
    """Run this partition's ranks to their end; rank 0's pickled result, else None.

    ``gpu_addresses``: the GPUs this task holds (``_engines.gpus_owned``).
    ``all_gather(message)``: every task's message, in partition order (tf_collective's worker
    endpoints, torch's master, Horovod's rendezvous); by default through the driver
    (``DriverLink.all_gather``).
    ``task_context``: serves ``BarrierTaskContext`` to the rank, where the task runs one.
    """
    hosts = _engines.rank_hosts(task_hosts, spec.ranks_per_task)
    first = sum(spec.ranks_per_task[:partition]) if spec.ranks_per_task else partition
    count = spec.ranks_per_task[partition] if spec.ranks_per_task else 1
    # One connection per rank: the driver knows a rank by its index in ``hosts``.
    links = [DriverLink(spec, index) for index in range(first, first + count)]
    held = []
    try:
        # No rank starts before the driver accepts the plan (Spark's barrier() polls: 1 s).
        links[0].request_plan(hosts)
        plan = _engines.plan_ranks(hosts)
        hostname = socket.gethostname()
        ranks = []
        for i, link in enumerate(links):
            slot = plan[first + i]
            who = _engines.describe_rank(slot.rank, hostname, slot.hostname)
            problem = _engines.hostname_problem(
                hosts, hostname, _resolve(hostname), slot.hostname
            ) or _gpu_problem(spec, partition, gpu_addresses)
            if problem is not None:
                message = f"{who} cannot start: {problem}"
                _report_failure(link, slot.rank, message, [], time.time(), _wire.CAUSE_HOST)
                raise errors.rank_failed(message, _wire.CAUSE_HOST)
            env = _engines.rank_env(
                slot,
                gloo_iface=_engines.gloo_iface_for(slot.hostname),
                options_env=spec.options_env,
                run_id=spec.run_id,
                gpu=_rank_gpus(spec, partition, i, gpu_addresses),
            )
            env[HVDFLOW_ENGINE] = spec.engine
            ranks.append((slot, who, env, link))
        task_env = _engines.engine(spec.engine).task_env
        if task_env is not None:
            if all_gather is None:
                all_gather = functools.partial(
                    links[0].all_gather, partition=partition, tasks=len(task_hosts)
                )
            place = _engines.TaskPlace(partition, len(task_hosts), spec.run_id, tuple(hosts))
            held = task_env(ranks, all_gather, place)
        if len(ranks) == 1:
            slot, who, env, link = ranks[0]
            return _supervise(slot.rank, who, env, spec, link, task_context)
        return _supervise_together(ranks, spec)
    finally:
        for sock in held:
            sock.close()
        for link in links:
            link.close()


def _gpu_problem(spec: TaskSpec, partition: int, gpu_addresses: Sequence[str]) -> str | None:
    """Why this task's worker cannot have the GPUs it was planned with, or None."""
    if spec.gpus_per_task is None:
        return None
    try:
        _engines.worker_gpus(spec.gpus_per_task[partition], gpu_addresses, spec.gpu_resource_name)
    except ValueError as e:
        return str(e)
    return None


def _rank_gpus(
    spec: TaskSpec, partition: int, index_in_task: int, gpu_addresses: Sequence[str]
) -> str | None:
    """CUDA_VISIBLE_DEVICES for a rank; None leaves the task's environment as it is."""
    if spec.gpus_per_task is not None:
        return _engines.worker_gpus(spec.gpus_per_task[partition], gpu_addresses)
    return _engines.gpu_for_rank(index_in_task, gpu_addresses)


def _supervise_together(ranks: list, spec: TaskSpec) -> bytes | None:
    """Supervise a task's ranks at once, one thread each: a rank dies with the thread that
    started it. The first failure is raised; the driver names the one that caused the others."""
    results: dict[int, bytes | None] = {}
    errors: dict[int, BaseException] = {}

    def supervise(slot, who, env, link) -> None:
        try:
            results[slot.rank] = _supervise(slot.rank, who, env, spec, link)
        except BaseException as e:
            errors[slot.rank] = e

    threads = [
        threading.Thread(target=supervise, args=rank, name=f"hvdflow-rank{rank[0].rank}")
        for rank in ranks
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[min(errors)]
    return next((r for r in results.values() if r is not None), None)


def barrier_task(spec: TaskSpec, _rows):
    """One Spark barrier task: runs its ranks; rank 0's task yields the pickled result. (Here,
    not with the driver, so executors import neither pydantic nor the driver's servers.)"""
    from pyspark import BarrierTaskContext

    ctx = BarrierTaskContext.get()
    hosts = [_engines.host_of(info.address) for info in ctx.getTaskInfos()]
    resource = ctx.resources().get(spec.gpu_resource_name)
    gpus = _engines.gpus_owned(
        os.environ.get(CUDA_VISIBLE_DEVICES), resource.addresses if resource else ()
    )
    result = run_task(spec, ctx.partitionId(), hosts, gpus, task_context=TaskContextServer(ctx))
    if result is not None:
        yield result


def _supervise(
    rank: int,
    who: str,
    rank_env_vars: Mapping[str, str],
    spec: TaskSpec,
    link: DriverLink,
    task_context: TaskContextServer | None = None,
):
    """Run the rank to its end; ``who`` names it in errors (``describe_rank``)."""
    tail: collections.deque[str] = collections.deque(maxlen=_wire.TAIL_LINES)
    init_reached = Reached()

    def note_progress(begun: int, finished: int, watch: bool) -> None:
        link.progress = {"rank": rank, "begun": begun, "finished": finished, "watch": watch}

    def ship(stream: str, text: str, at: float | None = None) -> None:
        line = _wire.LogLine(at or time.time(), rank, stream, text)
        tail.append(_wire.tail_line(line.formatted()))
        link.send({"type": _wire.LINE, **line.__dict__})

    with rank_workdir(rank) as workdir:
        payload_path = os.path.join(workdir, "payload.pkl")
        result_path = os.path.join(workdir, "result.pkl")
        stacks_path = os.path.join(workdir, "stacks.txt")
        with open(payload_path, "wb") as f:
            f.write(spec.payload)
        events_read, events_write = os.pipe()
        context_env, context_fds, context = {}, (), None
        if task_context is not None:
            context_env, context_fd, context = task_context.start()
            context_fds = (context_fd,)
        env = {
            **context_env,
            **os.environ,
            **rank_env_vars,
            HVDFLOW_EVENT_FD: str(events_write),
            HVDFLOW_PARENT_PID: str(os.getpid()),
            HVDFLOW_STACKS_FILE: stacks_path,
            "PYTHONUNBUFFERED": "1",
            "TMPDIR": workdir,  # goes with the folder: a killed rank's atexit never runs
        }
        # Its own session, for _kill_group. No preexec_fn (unsafe with threads): the rank sets
        # PR_SET_PDEATHSIG itself, which fires when this thread, its supervisor, exits.
        proc = subprocess.Popen(
            [sys.executable, "-m", RANK_MODULE, payload_path, result_path],
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            pass_fds=(events_write, *context_fds),
            start_new_session=True,
        )
        os.close(events_write)
        if context is not None:
            context.rank_started()
        started = time.monotonic()
        readers = start_readers(proc, events_read, ship, init_reached, note_progress)

        reason = cause = None
        try:
            while proc.poll() is None:
                if link.stacks_requested.is_set():
                    link.stacks_requested.clear()
                    text = _dump_stacks(proc, stacks_path)
                    link.send({"type": _wire.STACKS, "rank": rank, "text": text})
                stopped = _decisions.stop_reason(
                    aborted=link.aborted.is_set(),
                    driver_silent=link.lost(),
                    init_reached=_decisions.reached_in_time(
                        init_reached.at - started if init_reached.is_set() else None,
                        spec.start_timeout_s,
                    ),
                    waited_s=time.monotonic() - started,
                    start_timeout_s=spec.start_timeout_s,
                    heartbeat_timeout_s=spec.heartbeat_timeout_s,
                    engine=spec.engine,
                )
                if stopped is not None:
                    reason, cause = stopped
                    break
                time.sleep(_POLL_S)
        finally:
            exited_at = time.time()
            if proc.poll() is None:
                _kill_group(proc)
            for t in readers:
                t.join(timeout=5)
            if context is not None:
                context.close()

        if reason is None and proc.returncode != 0:
            reason = _decisions.exit_reason(proc.returncode)
            cause = _decisions.exit_cause(proc.returncode)
        if reason is not None:
            message = f"{who} {reason}"
            _report_failure(link, rank, message, list(tail), exited_at, cause)
            raise errors.rank_failed(message + _format_tail(tail), cause)
        if os.path.exists(result_path):
            with open(result_path, "rb") as f:
                return f.read()
        return None


def _report_failure(
    link: DriverLink, rank: int, reason: str, tail: list[str], exited_at: float, cause: str | None
) -> None:
    link.send(
        {
            "type": _wire.FAILED,
            "rank": rank,
            "reason": reason,
            "tail": tail,
            "exited_at": exited_at,
            "cause": cause,
        }
    )


def _dump_stacks(proc: subprocess.Popen, path: str) -> str:
    """The rank's Python stacks: signal its faulthandler (``_rank``), read what it wrote."""
    start = os.path.getsize(path) if os.path.exists(path) else 0
    try:
        os.kill(proc.pid, _rank.STACKS_SIGNAL)
    except ProcessLookupError:
        return "(the rank process had already exited)"
    time.sleep(STACKS_WAIT_S)
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            f.seek(start)
            text = f.read()
    except OSError as e:
        return f"(its stacks could not be read: {e})"
    if len(text) > _wire.MAX_STACKS_CHARS:
        text = text[: _wire.MAX_STACKS_CHARS] + "\n[... stacks truncated]"
    return text or "(it wrote no stacks: is it stuck outside Python, or are signals blocked?)"


def _resolve(hostname: str) -> str | None:
    try:
        return socket.gethostbyname(hostname)
    except OSError:
        return None


def _kill_group(proc: subprocess.Popen) -> None:
    """SIGTERM the rank's process group, then SIGKILL what is left after a short grace. SIGCONT
    follows SIGTERM: a stopped process would otherwise die by SIGKILL without cleaning up."""
    for sig, grace in ((signal.SIGTERM, 3.0), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(proc.pid, sig)
            if sig == signal.SIGTERM:
                os.killpg(proc.pid, signal.SIGCONT)
        except ProcessLookupError:
            return
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=grace)
            return


def _format_tail(tail: Sequence[str]) -> str:
    return f". {errors.OUTPUT_HEADING}\n" + "\n".join(tail) if tail else " (it wrote no output)"
