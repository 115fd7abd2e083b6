"""Task side of HorovodRunner: start the task's rank process (one per GPU where the task holds
several), stream its output, stop it when told.

Runs inside a Spark barrier task (or a driver thread for ``np < 0``). The rank is a separate
process, a new interpreter, so that Horovod and the user's imports get a process of their own,
and so that it can be killed as a whole: it runs in its own process group, and it asks to die with
its parent (PR_SET_PDEATHSIG, set by the rank itself in ``_rank``), so a killed Spark worker
cannot leave a rank behind.

A host cut off from the driver sees no close, only silence: a task that hears nothing from the
driver for ``heartbeat_timeout_s`` kills its rank too (``_liveness``).
"""

from __future__ import annotations

import collections
import os
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from hvdflow.infra.constants import (
    CUDA_VISIBLE_DEVICES,
    HVDFLOW_ENGINE,
    HVDFLOW_EVENT_FD,
    HVDFLOW_PARENT_PID,
    HVDFLOW_STACKS_FILE,
)
from hvdflow.infra.launcher import _liveness, _placement, _rank_output, _wire
from hvdflow.infra.launcher._decisions import (
    exit_cause,
    exit_reason,
    reached_in_time,
    stop_reason,
)
from hvdflow.infra.launcher._engines import engine
from hvdflow.infra.launcher._rank import STACKS_SIGNAL
from hvdflow.infra.launcher._relay import RelaySpec, TaskRelay
from hvdflow.infra.launcher._task_context import TaskContextServer
from hvdflow.infra.launcher._workdir import rank_workdir
from hvdflow.infra.launcher.errors import OUTPUT_HEADING, RankFailed, rank_failed

# The rank process's entry point, run as ``python -m``.
RANK_MODULE = "hvdflow.infra.launcher._rank"
# How long a task waits to connect to the driver's channel.
CONNECT_TIMEOUT_S = 30.0
# How long it waits when the run offers the object store relay to fall back on.
RELAY_AFTER_S = 5.0
# How long a task waits for the driver to accept the plan before giving up.
PLAN_TIMEOUT_S = 60.0
# How long a task waits for the other tasks' parts of the exchange (they start together: a
# barrier stage's tasks are launched at once).
GATHER_TIMEOUT_S = 300.0
_POLL_S = 0.1
# How long a task gives its rank's faulthandler to write the stacks before it reads them.
STACKS_WAIT_S = 1.0


@dataclass(frozen=True)
class TaskSpec:
    """Everything a task needs, as plain values: it travels to executors in the closure."""

    payload: bytes
    driver_host: str
    driver_port: int
    token: str
    rendezvous_addr: str
    rendezvous_port: int
    options_env: Mapping[str, str]
    run_id: str
    start_timeout_s: float
    heartbeat_timeout_s: float = _wire.DEFAULT_HEARTBEAT_TIMEOUT_S
    engine: str = _wire.HOROVOD
    # How many ranks each task runs, by partition: a task holding k GPUs runs k ranks, one per
    # GPU (Databricks' HorovodRunner on GPU clusters). None: one rank per task.
    ranks_per_task: tuple[int, ...] | None = None
    # How many of its task's GPUs each task's one worker uses (MirroredStrategyRunner: num_slots
    # GPUs spread over the tasks; 0 hides them). None: each rank gets one GPU of its task.
    gpus_per_task: tuple[int, ...] | None = None
    # The Spark resource name the tasks hold their GPUs under.
    gpu_resource_name: str = "gpu"
    # The channel through the object store, for a task that cannot reach the driver (None: the
    # run offers none).
    relay: RelaySpec | None = None


class DriverLink:
    """This task's connection to the driver; a close from the driver means abort.

    Sends a heartbeat every HEARTBEAT_INTERVAL_S and notes when it last heard from the driver
    (``lost()``), since a cut network closes nothing.
    """

    def __init__(self, spec: TaskSpec, slot: int):
        # The rank's progress (rank, begun, finished, watch), sent with every heartbeat once
        # the rank has reached hvd.init(); None before.
        self.progress: dict | None = None
        # Set when the driver asks for the rank's Python stacks (the run stalled).
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
            # The rank slot's index in the plan: the task's partition where each task runs
            # one rank, which is how the driver's reports name a rank before it has one.
            "partition": slot,
            "hostname": socket.gethostname()[: _wire.MAX_HOSTNAME_CHARS],
            # Why this task came through the relay: the driver logs it.
            **({"relayed": relayed} if relayed else {}),
        }
        try:
            self.conn.send(hello)
        except OSError as e:  # the relay's object store, away
            raise RankFailed(f"rank slot {slot} could not say hello to the driver: {e}") from None
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
        silent = _liveness.is_overdue(self.last_heard, time.monotonic(), self.heartbeat_timeout_s)
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
        """The driver's reply of type ``kind``; RankFailed if the driver closes first or the
        reply takes longer than ``timeout_s`` (``setting``, in this module)."""
        deadline = time.monotonic() + timeout_s
        with self._reply_ready:
            while (
                reply := next((m for m in self._replies if m.get("type") == kind), None)
            ) is None:
                if self.aborted.is_set():
                    raise RankFailed(
                        f"the driver closed the connection before it {what}: "
                        "the run was cancelled, or the driver stopped"
                    )
                left = deadline - time.monotonic()
                if left <= 0:
                    raise RankFailed(
                        f"the driver had not {what} within {timeout_s:g} s "
                        f"(hvdflow.infra.launcher._task.{setting}); "
                        "is the driver still running?"
                    )
                self._reply_ready.wait(left)
            self._replies.remove(reply)
            return reply

    def close(self) -> None:
        """Say bye (this task ends on its own, it did not die), then close."""
        self._closed.set()
        self.send({"type": _wire.BYE})
        self.conn.close()


def _connect(spec: TaskSpec, slot: int) -> tuple[_wire.Connection | TaskRelay, str | None]:
    """This slot's connection to the driver: the direct one, else the relay (``_relay``) where
    the run offers one; and why the relay, if it is used."""
    relay = spec.relay
    if relay is not None and relay.always:
        return TaskRelay(relay, slot), "the run asked for the relay (LaunchOptions relay='always')"
    address = (spec.driver_host, spec.driver_port)
    # With a relay to fall back on, give the direct channel less time: a firewall that drops
    # the connection makes the task wait this long before every run.
    timeout_s = CONNECT_TIMEOUT_S if relay is None else RELAY_AFTER_S
    try:
        sock = socket.create_connection(address, timeout=timeout_s)
    except OSError as e:
        if relay is not None:
            return TaskRelay(relay, slot), (
                f"{socket.gethostname()} could not connect to {address[0]}:{address[1]} "
                f"within {timeout_s:g} s: {e}"
            )
        raise RankFailed(
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
    # A send still stuck after heartbeat_timeout_s means the driver read nothing for that
    # long: give it up (lost()) rather than block a thread, and the lock it holds, forever.
    seconds = spec.heartbeat_timeout_s
    sock.setsockopt(
        socket.SOL_SOCKET,
        socket.SO_SNDTIMEO,
        struct.pack("ll", int(seconds), int(seconds % 1 * 1e6)),
    )
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

    ``gpu_addresses``: the GPUs this task holds (``_placement.gpus_owned``).
    ``all_gather(message)``: every task's message, in partition order; the tf_collective
    engine exchanges its workers' endpoints with it, the torch engine its master. By default
    the exchange goes through the driver (``DriverLink.all_gather``).
    ``task_context``: serves ``BarrierTaskContext`` to the rank, where the task runs one.
    """
    hosts = _placement.rank_hosts(task_hosts, spec.ranks_per_task)
    first = sum(spec.ranks_per_task[:partition]) if spec.ranks_per_task else partition
    count = spec.ranks_per_task[partition] if spec.ranks_per_task else 1
    # One connection per rank: the driver knows a rank by its index in ``hosts``.
    links = [DriverLink(spec, index) for index in range(first, first + count)]
    held = []
    try:
        # No rank starts before the rendezvous server knows the plan: every task waits for the
        # driver to accept it. (Spark's BarrierTaskContext.barrier() would order it too, but a
        # task waiting in it looks once a second: a second of every launch.)
        links[0].request_plan(hosts)
        plan = _placement.plan_ranks(hosts)
        hostname = socket.gethostname()
        ranks = []
        for i, link in enumerate(links):
            slot = plan[first + i]
            who = _placement.describe_rank(slot.rank, hostname, slot.hostname)
            problem = _placement.hostname_problem(
                hosts, hostname, _resolve(hostname), slot.hostname
            ) or _gpu_problem(spec, partition, gpu_addresses)
            if problem is not None:
                message = f"{who} cannot start: {problem}"
                _report_failure(link, slot.rank, message, [], time.time(), _wire.CAUSE_HOST)
                raise rank_failed(message, _wire.CAUSE_HOST)
            env = _placement.rank_env(
                slot,
                rendezvous_addr=spec.rendezvous_addr,
                rendezvous_port=spec.rendezvous_port,
                gloo_iface=_placement.gloo_iface_for(slot.hostname),
                options_env=spec.options_env,
                run_id=spec.run_id,
                gpu=_rank_gpus(spec, partition, i, gpu_addresses),
            )
            env[HVDFLOW_ENGINE] = spec.engine
            ranks.append((slot, who, env, link))
        task_env = engine(spec.engine).task_env
        if task_env is not None:
            if all_gather is None:

                def all_gather(part: str) -> list[str]:
                    return links[0].all_gather(part, partition, len(task_hosts))

            held = task_env(ranks, all_gather, partition, len(task_hosts), spec.run_id)
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
        _placement.worker_gpus(spec.gpus_per_task[partition], gpu_addresses, spec.gpu_resource_name)
    except ValueError as e:
        return str(e)
    return None


def _rank_gpus(
    spec: TaskSpec, partition: int, index_in_task: int, gpu_addresses: Sequence[str]
) -> str | None:
    """CUDA_VISIBLE_DEVICES for a rank; None leaves the task's environment as it is."""
    if spec.gpus_per_task is not None:
        return _placement.worker_gpus(spec.gpus_per_task[partition], gpu_addresses)
    return _placement.gpu_for_rank(index_in_task, gpu_addresses)


def _supervise_together(ranks: list, spec: TaskSpec) -> bytes | None:
    """Supervise a task's ranks at once, one thread each (a task holding several GPUs).

    Each rank asks to die with the thread that started it (``_rank``), and that thread
    supervises it to its end. The first failure is raised; the driver, told by every rank,
    names the one that caused the others and stops the rest.
    """
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
    """One Spark barrier task: runs its ranks; rank 0's task yields the pickled result.

    Lives here, not with the driver code, so executors import neither pydantic nor the
    driver's servers.
    """
    from pyspark import BarrierTaskContext

    ctx = BarrierTaskContext.get()
    hosts = [_placement.host_of(info.address) for info in ctx.getTaskInfos()]
    resource = ctx.resources().get(spec.gpu_resource_name)
    gpus = _placement.gpus_owned(
        os.environ.get(CUDA_VISIBLE_DEVICES), resource.addresses if resource else ()
    )
    result = run_task(
        spec,
        ctx.partitionId(),
        hosts,
        gpus,
        task_context=TaskContextServer(ctx),
    )
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
    init_reached = _rank_output.Reached()

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
            # The rank's temporary files (TensorFlow's AutoGraph modules, MLflow's staging)
            # go in this folder, under the task's own TMPDIR, and go with it when the rank
            # ends, killed or not: a killed rank's atexit clean-up never runs.
            "TMPDIR": workdir,
        }
        # A new interpreter in its own session (its own process group: _kill_group stops all
        # of it). No preexec_fn: it is unsafe in a process with threads. The rank sets
        # PR_SET_PDEATHSIG on itself; the signal fires when this thread exits, and this thread
        # supervises the rank to its end.
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
        readers = _rank_output.start_readers(proc, events_read, ship, init_reached, note_progress)

        reason = cause = None
        try:
            while proc.poll() is None:
                if link.stacks_requested.is_set():
                    link.stacks_requested.clear()
                    link.send(
                        {
                            "type": _wire.STACKS,
                            "rank": rank,
                            "text": _dump_stacks(proc, stacks_path),
                        }
                    )
                stopped = stop_reason(
                    aborted=link.aborted.is_set(),
                    driver_silent=link.lost(),
                    init_reached=reached_in_time(
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
            reason, cause = exit_reason(proc.returncode), exit_cause(proc.returncode)
        if reason is not None:
            message = f"{who} {reason}"
            _report_failure(link, rank, message, list(tail), exited_at, cause)
            raise rank_failed(message + _format_tail(tail), cause)
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
        os.kill(proc.pid, STACKS_SIGNAL)
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
    """The IPv4 address ``hostname`` resolves to here, or None."""
    try:
        return socket.gethostbyname(hostname)
    except OSError:
        return None


def _kill_group(proc: subprocess.Popen) -> None:
    """SIGTERM the rank's process group, then SIGKILL what is left after a short grace.

    SIGCONT follows SIGTERM, as systemd and Kubernetes do: a stopped process (SIGSTOP, a
    debugger, a frozen cgroup) would keep SIGTERM pending through its grace and die by SIGKILL
    without cleaning up; woken, it handles SIGTERM at once."""
    for sig, grace in ((signal.SIGTERM, 3.0), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(proc.pid, sig)
            if sig == signal.SIGTERM:
                os.killpg(proc.pid, signal.SIGCONT)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=grace)
            return
        except subprocess.TimeoutExpired:
            continue


def _format_tail(tail: Sequence[str]) -> str:
    if not tail:
        return " (it wrote no output)"
    return f". {OUTPUT_HEADING}\n" + "\n".join(tail)
