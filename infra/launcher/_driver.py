"""The driver's process: one ``LaunchPlan`` from the pickled function to rank 0's result.

``Launch`` checks what it can first, serves the tasks' channel, runs the barrier stage (one
DataFrame stage, classic or over Spark Connect; ``np < 0``: a driver thread), watches liveness
and progress, and turns the first failure into one error naming the rank, its host and output.
Nothing is believed before the run's token (never logged); servers bind the executor address.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import math
import os
import re
import secrets
import socket
import socketserver
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Literal

import cloudpickle

from hvdflow.infra import constants as c
from hvdflow.infra import executor_python
from hvdflow.infra.connect import is_connect
from hvdflow.infra.home import hvdflow_home
from hvdflow.infra.launcher import _decisions, _engines, _relay, _task, _wire, errors
from hvdflow.infra.launcher.options import LaunchOptions
from hvdflow.infra.storage.access import s3_endpoint

# --- The pickled function ---


def pickle_payload(main: Callable[..., Any], kwargs: dict[str, Any]) -> bytes:
    if not callable(main):
        raise ValueError(f"main={main!r}: expected a function to run on every rank")
    try:
        return cloudpickle.dumps((main, kwargs))
    except Exception as e:
        raise ValueError(
            f"main cannot be sent to the ranks: {unpicklable_part(main, kwargs)} cannot be "
            f"pickled ({type(e).__name__}: {e}). Create it inside main, or pass something "
            "picklable instead (a path, a config)."
        ) from e


def unpicklable_part(main: Callable[..., Any], kwargs: dict[str, Any]) -> str:
    """Name the argument, captured variable or global that cloudpickle chokes on."""

    def fails(value: Any) -> bool:
        try:
            cloudpickle.dumps(value)
            return False
        except Exception:
            return True

    for key, value in kwargs.items():
        if fails(value):
            return f"keyword argument {key!r} ({type(value).__name__})"
    code = getattr(main, "__code__", None)
    if code is not None:
        for name, cell in zip(code.co_freevars, main.__closure__ or (), strict=False):
            value = cell.cell_contents
            if fails(value):
                return f"variable {name!r} ({type(value).__name__}) that main captures"
        module_globals = getattr(main, "__globals__", {})
        for name in code.co_names:
            if name in module_globals and fails(module_globals[name]):
                return f"global {name!r} ({type(module_globals[name]).__name__}) that main uses"
    return f"main ({main!r})"


# --- Task slots: how many barrier tasks can run at once ---

logger = logging.getLogger(__name__)

_LOCAL_MASTER = re.compile(r"local\[(\d+)(,\d+)?\]$")
# What Spark's barrier check says when it refuses a stage for want of task slots.
SLOTS_REFUSED = "SPARK-24819"
# How often a refused stage is submitted again while slot_wait_s lasts.
RESUBMIT_EVERY_S = 1.0


def refused_for_slots(error: BaseException | str) -> bool:
    """Whether Spark refused a barrier stage for want of task slots: no task of it started."""
    return SLOTS_REFUSED in str(error)


def task_slots(spark) -> int | None:
    """Tasks the cluster can run at once; over Connect only a ``local[N]`` master's, else None."""
    if is_connect(spark):
        local = _LOCAL_MASTER.match(spark.conf.get("spark.master", ""))
        if local is None:
            return None
        return int(local.group(1)) // int(spark.conf.get("spark.task.cpus", "1"))
    jsc = spark.sparkContext._jsc.sc()
    profile = jsc.resourceProfileManager().defaultResourceProfile()
    return int(jsc.maxNumConcurrentTasks(profile))


def task_gpu_amount(conf, resource_name: str) -> float | None:
    """``spark.task.resource.<name>.amount``: the GPUs each task holds, None where unset."""
    value = conf.get(f"spark.task.resource.{resource_name}.amount", None)
    return float(value) if value is not None else None


def wait_for_slots(
    spark, tasks: int, wait_s: float, asked: str | None = None, setting: str = "np"
) -> None:
    """Fail fast where Spark would re-check a barrier stage without slots for minutes (``asked``:
    what needs them; ``setting``: the argument to lower). Uncountable slots are left to Spark."""
    asked = asked or f"np={tasks}"
    deadline = time.monotonic() + wait_s
    while (slots := task_slots(spark)) is not None and slots < tasks:
        if time.monotonic() >= deadline:
            master = spark.conf.get("spark.master", "?")
            raise RuntimeError(
                f"{asked} needs {tasks} task slots but the cluster ({master}) has {slots} "
                f"after waiting {wait_s:g} s (slot_wait_s): lower {setting}, or add executors, "
                "cores or GPUs (barrier mode starts every task at once)"
            )
        time.sleep(0.5)
    if slots is None:
        logger.info(
            "%s: the cluster's free task slots cannot be counted through Spark Connect; Spark's "
            "barrier check fails the stage if there are fewer than %d",
            asked,
            tasks,
        )


# --- The run's log: the file, the rank logger, the tails ---

rank_logger = logging.getLogger("hvdflow.infra.launcher.runner.ranks")


class RunLog:
    """Every rank output line of one run goes to ``driver.log`` and the user's ``on_log_line``;
    those ``driver_log_verbosity`` selects also go to the ``...runner.ranks`` logger."""

    def __init__(self, path: str, verbosity: str, consumer):
        self._file = open(path, "a", buffering=1, encoding="utf-8")
        self._lock = threading.Lock()
        self._verbosity = verbosity
        self._consumer = consumer
        # Each rank's last lines, for an error about a rank that cannot report its own.
        self._tails: dict[int, collections.deque[str]] = {}

    def tail(self, rank: int) -> list[str]:
        with self._lock:
            return list(self._tails.get(rank, ()))

    def __call__(self, line: _wire.LogLine) -> None:
        with self._lock:
            self._file.write(line.to_log_file_line() + "\n")
            tail = self._tails.setdefault(line.rank, collections.deque(maxlen=_wire.TAIL_LINES))
            tail.append(_wire.tail_line(line.formatted()))
        if self._verbosity == "all" or line.stream == _wire.CALLBACK:
            rank_logger.info("%s", line.formatted())
        if self._consumer is not None:
            self._consumer(line)

    def __enter__(self) -> RunLog:
        return self

    def __exit__(self, *exc) -> None:
        with self._lock:
            self._file.close()


# --- The barrier stage ---

RESULT_SCHEMA = "seq int, chunk binary"
# Well under Spark Connect's Arrow batch size (spark.connect.grpc.arrow.maxBatchSize, 4 MB).
CHUNK_BYTES = 1 << 20


def chunks(data: bytes, size: int = CHUNK_BYTES) -> Iterator[tuple[int, bytes]]:
    """``data`` as numbered pieces of at most ``size`` bytes (one empty piece for no bytes)."""
    yield from enumerate(data[start : start + size] for start in range(0, len(data) or 1, size))


def joined(rows: Iterable[tuple[int, bytes]]) -> bytes | None:
    """The bytes ``chunks`` cut, from its rows in any order; None where there are none."""
    ordered = sorted(rows, key=lambda row: row[0])
    if not ordered:
        return None
    if (seqs := [seq for seq, _ in ordered]) != list(range(len(ordered))):
        raise RuntimeError(
            f"rank 0's result came back as pieces {seqs}: some are missing or repeated"
        )
    return b"".join(bytes(piece) for _, piece in ordered)


def barrier_batches(spec: _task.TaskSpec, batches):
    """``mapInArrow``'s function on each task: run its ranks, answer with rank 0's pieces."""
    import pyarrow as pa  # noqa: PLC0415 (executors: Spark's Arrow runner has loaded it)

    schema = pa.schema([("seq", pa.int32()), ("chunk", pa.binary())])
    for _ in batches:  # the task's one input row says nothing: its partition is its place
        pass
    for result in _task.barrier_task(spec, ()):
        for seq, piece in chunks(result):
            yield pa.RecordBatch.from_pydict({"seq": [seq], "chunk": [piece]}, schema=schema)


def run_barrier_stage(spark, spec: _task.TaskSpec, tasks: int, tag: str) -> bytes | None:
    """Run ``tasks`` barrier tasks under ``tag`` (``interruptTag`` cancels); rank 0's result."""
    spark.addTag(tag)
    try:
        rows = (
            spark.range(0, tasks, 1, numPartitions=tasks)
            .mapInArrow(partial(barrier_batches, spec), RESULT_SCHEMA, barrier=True)
            .collect()
        )
    finally:
        spark.removeTag(tag)
    return joined((row.seq, row.chunk) for row in rows)


# --- The tasks' channel, the driver's end ---

# A silent stranger must not hold a server thread for the rest of the run.
HELLO_TIMEOUT_S = 10.0
# A token and a partition number: nothing bigger is read unauthenticated.
HELLO_MAX_BYTES = 1024


class DriverChannel:
    """Accepts task connections, collects rank output and failures, and can abort every task."""

    def __init__(
        self,
        bind_host: str,
        on_line: Callable[[_wire.LogLine], None],
        *,
        relay: _relay.RelaySpec | None = None,
        slots: int | None = None,
    ):
        """``relay``: also serve tasks through the object store until ``slots`` rank slots
        joined directly."""
        self.bind_host = bind_host
        self.relay: _relay.DriverRelay | None = None  # started last
        self.token = secrets.token_hex(16)
        self._on_line = on_line
        self._lock = threading.Lock()
        self._connections: list[_wire.Connection] = []
        self._reading = 0  # connections still being read; ``drain`` waits for them
        self._drained = threading.Condition(self._lock)
        self.failures: list[dict] = []
        self.failed = threading.Event()
        self._closed = False
        self.liveness = _decisions.Tracker()  # heartbeat_timeout_s
        self.progress = _decisions.ProgressTracker()  # stall_timeout_s
        self.stacks: dict[int, str] = {}
        self._plan: list[str] | None = None  # the task hosts, from the first task
        self._parts: dict[int, str] = {}  # GATHER: each task's part by partition
        self._gatherers: list[_wire.Connection] = []
        self._server = _ChannelServer((bind_host, 0), self._handler_class())
        self.port = self._server.server_address[1]
        # A short poll interval: shutdown() waits up to one interval, at the end of every run.
        self._thread = threading.Thread(
            target=self._server.serve_forever, args=(0.05,), daemon=True, name="hvdflow-channel"
        )
        self._thread.start()
        if relay is not None:
            self.relay = _relay.DriverRelay(relay, self._serve_connection, slots)

    def _handler_class(self):
        channel = self

        class Handler(socketserver.StreamRequestHandler):
            def handle(self):
                channel._serve(self.request)

        return Handler

    def _serve(self, sock: socket.socket) -> None:
        sock.settimeout(HELLO_TIMEOUT_S)
        # A task may stay silent for as long as its rank prints nothing: block after the hello.
        self._serve_connection(_wire.Connection(sock), lambda: sock.settimeout(None))

    def _serve_connection(self, conn, after_hello: Callable[[], None] = lambda: None) -> None:
        """One task's messages until its connection ends (a socket's or a relay's)."""
        hello = conn.receive(limit=HELLO_MAX_BYTES)
        if not isinstance(hello, dict) or hello.get("type") != _wire.HELLO:
            logger.warning(
                "closed a connection to the driver channel that sent no hello within %g s "
                "(HELLO_TIMEOUT_S) and %d bytes (HELLO_MAX_BYTES)",
                HELLO_TIMEOUT_S,
                HELLO_MAX_BYTES,
            )
            return conn.close()
        if not secrets.compare_digest(str(hello.get("token", "")), self.token):
            logger.warning("rejected a connection to the driver channel with a wrong token")
            return conn.close()
        after_hello()
        hostname = str(hello.get("hostname", ""))[: _wire.MAX_HOSTNAME_CHARS]
        if self.relay is not None:
            if not hello.get("relayed"):
                self.relay.joined_directly(hello.get("partition"))
            else:  # a relayed hello can only come through the relay this run offered
                logger.info(
                    "rank slot %s on %s reaches the driver through the object store (%s): %s",
                    hello.get("partition"),
                    hostname,
                    self.relay.spec.uri,
                    str(hello.get("relayed"))[:300],
                )
        with self._lock:
            if self._closed or self.failed.is_set():
                # Spark re-running the barrier stage (spark.task.maxFailures): its ranks would
                # train beside the step's own retry, which resumes from the checkpoint.
                logger.warning(
                    "refused a task of partition %s: this run has already failed (Spark "
                    "re-running the barrier stage); the caller's retry resumes instead",
                    hello.get("partition"),
                )
                return conn.close()
            self._connections.append(conn)
            self._reading += 1
        self.liveness.join(conn, hello.get("partition"), hello.get("hostname"))
        said_bye, driver_error = False, None
        try:
            while (message := conn.receive()) is not None:
                said_bye = message.get("type") == _wire.BYE
                self._dispatch(conn, message, hostname)
        except BaseException as error:
            # Said here: socketserver prints to a stderr that may have no reader.
            logger.exception("the driver stopped reading rank slot %s", hello.get("partition"))
            driver_error = error
            raise
        finally:
            # No bye: the task died, unless the driver closed it (abort) or failed reading it.
            report = self.liveness.leave(
                conn, vanished=not said_bye and not self._closed, driver_error=driver_error
            )
            if report is not None:
                self.report(report)
            with self._drained:
                self._reading -= 1
                self._drained.notify_all()

    def drain(self, timeout_s: float) -> bool:
        """Wait until every connection ended, all it sent read (Spark's result can arrive before a
        task's last lines); False on timeout."""
        with self._drained:
            return self._drained.wait_for(lambda: self._reading == 0, timeout_s)

    def _dispatch(self, conn: _wire.Connection, message: dict, hostname: str = "") -> None:
        kind = message.get("type")
        self.liveness.seen(conn)  # any message is a sign of life
        if kind == _wire.HEARTBEAT:
            if "progress" in message:
                self.progress.update(message["progress"], hostname)
            with contextlib.suppress(OSError):  # a task gone: its connection ends next
                conn.send({"type": _wire.HEARTBEAT})
        elif kind == _wire.LINE:
            line = _wire.LogLine(*(message[k] for k in ("time", "rank", "stream", "text")))
            try:
                self._on_line(line)
            # A consumer's bug must not stop the stream; nor its SystemExit (Rich raises one on
            # a broken pipe), which here would end the task's connection, not the process.
            except (Exception, SystemExit):
                logger.exception("a rank output consumer failed on %s", line.formatted())
        elif kind == _wire.PLAN:
            self._accept_plan(conn, list(message["hosts"]))
        elif kind == _wire.GATHER:
            self._gather(conn, int(message["partition"]), int(message["tasks"]), message["part"])
        elif kind == _wire.FAILED:
            self.report(message)
        elif kind == _wire.STACKS:
            rank, text = message.get("rank"), message.get("text")
            if isinstance(rank, int) and isinstance(text, str):
                with self._lock:
                    self.stacks[rank] = text[: _wire.MAX_STACKS_CHARS]

    def _accept_plan(self, conn: _wire.Connection, hosts: list[str]) -> None:
        """Every task sends the plan (its stage's task hosts) and starts its ranks once answered:
        the first plan is the run's, and liveness watches its hosts."""
        with self._lock:
            first, planned = self._plan is None, self._plan
            if first:
                self._plan = hosts
                self.liveness.plan(hosts)
        if not first and planned != hosts:
            # Left unanswered, the task says the driver did not accept its plan.
            logger.error("a task sent the rank plan %s after %s: not accepted", hosts, planned)
            return
        conn.send({"type": _wire.PLAN_OK})

    def _gather(self, conn: _wire.Connection, partition: int, tasks: int, part: str) -> None:
        """The engines' one exchange among tasks: ``allGather`` without Spark's 1 s wake-up."""
        with self._lock:
            self._parts[partition] = part
            self._gatherers.append(conn)
            if len(self._parts) < tasks:
                return
            parts = [self._parts[p] for p in sorted(self._parts)]
            waiting, self._gatherers = self._gatherers, []
        for waiter in waiting:
            with contextlib.suppress(OSError):  # a task gone: its connection ends next
                waiter.send({"type": _wire.GATHERED, "parts": parts})

    def request_stacks(self) -> None:
        """Ask every task for its rank's Python stacks; they arrive in ``stacks``."""
        with self._lock:
            self.stacks.clear()
            connections = list(self._connections)
        for conn in connections:
            with contextlib.suppress(OSError):  # a task gone: its stacks will be missing
                conn.send({"type": _wire.DUMP_STACKS})

    def report(self, failure: dict) -> None:
        with self._lock:
            self.failures.append(failure)
        self.failed.set()

    def gather_failures(
        self, expected: int, within_s: float, on_poll: Callable[[], None] = lambda: None
    ) -> None:
        """After a first failure, wait up to ``within_s`` for ``expected`` reports or no open
        connection. Spark may end the job before a lost host's connection is seen to end, and
        without that report a surviving peer would be blamed."""
        deadline = time.monotonic() + within_s
        while len(self.failures) < expected and time.monotonic() < deadline:
            on_poll()
            # A connection's last report is recorded before it stops counting as read.
            if self.drain(0.05):
                return

    def root_failure(self) -> tuple[Mapping | None, list[int]]:
        with self._lock:
            failures = list(self.failures)
        return _decisions.root_failure(failures)

    def abort(self) -> None:
        """Close every task connection: each task then kills its rank process."""
        with self._lock:
            self._closed = True
            connections, self._connections = self._connections, []
        for conn in connections:
            conn.close()

    def close(self) -> None:
        self.abort()
        if self.relay is not None:
            self.relay.close()
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)

    def __enter__(self) -> DriverChannel:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class _ChannelServer(socketserver.ThreadingTCPServer):
    daemon_threads = True
    # np tasks connect at once: a backlog of 5 drops later SYNs for TCP's 1 s retry.
    request_queue_size = socket.SOMAXCONN


# --- The run: one LaunchPlan from the payload to rank 0's result ---

Verbosity = Literal["log_callback_only", "all"]
VERBOSITIES = ("log_callback_only", "all")
_STOP_GRACE_S = 30.0  # for tasks to stop after a cancel
_SETTLE_S = 2.0  # to gather failure reports before naming the root one
_POLL_S = 0.2
_DRAIN_S = 5.0  # for a successful run's connections to end
_STACKS_WAIT_S = 5.0  # for every rank's stacks after a stall


@dataclass(frozen=True)
class LaunchPlan:
    """What a face (HorovodRunner, MirroredStrategyRunner, TorchDistributor) hands ``Launch``.

    ``np``, ``options``, ``driver_log_verbosity``: HorovodRunner's arguments, checked here;
    ``face``: the runner called, as errors name it; ``size_argument``: its argument for the number
    of ranks; ``ignore_ssl_conf``: its Spark conf allowing an encrypted cluster; ``asked``: what
    errors say was asked (default ``np=N``); ``gpu_plan``: how GPUs go to ranks; ``layout``: ranks
    per barrier task (None: one per slot, k for a task of k GPUs; on the driver, all).
    """

    np: int = 1
    options: LaunchOptions = field(default_factory=LaunchOptions)
    driver_log_verbosity: Verbosity = "log_callback_only"
    face: str = "HorovodRunner"
    size_argument: str = "np"
    ignore_ssl_conf: str = "databricks.horovod.ignoreSsl"  # Databricks' own
    asked: str | None = None
    gpu_plan: _engines.GpuPlan = field(default_factory=_engines.GpuPlan)
    layout: tuple[int, ...] | None = None

    def __post_init__(self):
        if isinstance(np := self.np, bool) or not isinstance(np, int) or np == 0:
            raise ValueError(
                f"np={np!r}: expected a non-zero integer, the number of ranks (np > 0 on the "
                "Spark cluster, np < 0 for that many processes on the driver; np=0, every task "
                "slot, was deprecated by Databricks: set the number explicitly)"
            )
        if self.driver_log_verbosity not in VERBOSITIES:
            raise ValueError(
                f"driver_log_verbosity={self.driver_log_verbosity!r}: expected one of {VERBOSITIES}"
            )
        if not isinstance(self.options, LaunchOptions):
            raise ValueError(
                f"options={self.options!r}: expected a LaunchOptions "
                "(from hvdflow import LaunchOptions)"
            )


def _in_thread(target: Callable[[], Any], name: str) -> tuple[threading.Event, dict[str, Any]]:
    """Run ``target`` in a daemon thread; ``done`` is set once ``outcome`` holds what it gave."""
    outcome: dict[str, Any] = {}
    done = threading.Event()

    def run() -> None:
        try:
            outcome["result"] = target()
        except BaseException as e:
            outcome["error"] = e
        finally:
            done.set()

    threading.Thread(target=run, daemon=True, name=name).start()
    return done, outcome


class Launch:
    """One run of a ``LaunchPlan`` on the driver: the payload out, the tasks watched, rank 0's
    result back. ``log_path`` and ``run_id`` are set as soon as the run starts."""

    def __init__(self, plan: LaunchPlan):
        self.plan = plan
        self.log_path: str | None = None
        self.run_id: str | None = None

    def _name(self) -> str:
        return f"{self.plan.face} {self.plan.asked or f'np={self.plan.np}'}"

    def run(self, main: Callable[..., Any], kwargs: dict[str, Any]) -> Any:
        """Run ``main(**kwargs)`` on every rank; return what rank 0 returned."""
        payload = pickle_payload(main, kwargs)
        if self.plan.np < 0:
            self._require_engine(None)
        self.plan.options.horovod.warn_about_costs(self.plan.options.forwarded())
        self.run_id = uuid.uuid4().hex[:12]
        # Not in /tmp, which nothing cleans and a reboot empties.
        log_dir = self.plan.options.log_dir or str(
            hvdflow_home() / "logs" / "runs" / f"{time.strftime('%Y%m%d-%H%M%S')}-{self.run_id}"
        )
        os.makedirs(log_dir, exist_ok=True)
        self.log_path = os.path.join(log_dir, "driver.log")
        with RunLog(
            self.log_path, self.plan.driver_log_verbosity, self.plan.options.on_log_line
        ) as sink:
            started = time.monotonic()
            run = self._run_on_driver if self.plan.np < 0 else self._run_on_spark
            result = run(payload, sink)
            elapsed = time.monotonic() - started
            logger.info("%s finished in %.1f s (log: %s)", self._name(), elapsed, self.log_path)
        return cloudpickle.loads(result) if result is not None else None

    def _require_engine(self, spark) -> None:
        """What the engine needs, of the executors of ``spark`` (None: of this process)."""
        engine = self.plan.options.engine
        instead = (
            "hvdflow.TorchDistributor for a PyTorch function"
            if engine == _wire.TF_COLLECTIVE
            else "options=LaunchOptions(engine='tf_collective') (TensorFlow's "
            "MultiWorkerMirroredStrategy)"
        )
        executor_python.require_engine(
            spark, _engines.engine(engine).extra, f"{self._name()} with engine={engine!r}", instead
        )

    def _spec(
        self, payload: bytes, channel: DriverChannel, ranks_per_task: tuple[int, ...] | None
    ) -> _task.TaskSpec:
        return _task.TaskSpec(
            payload=payload,
            driver_host=channel.bind_host,
            driver_port=channel.port,
            token=channel.token,
            # Forwarded values may be secrets: they travel in the task closure, never in logs.
            options_env={**self.plan.options.forwarded(), **self.plan.options.horovod.to_env()},
            run_id=self.run_id,
            start_timeout_s=self.plan.options.start_timeout_s,
            heartbeat_timeout_s=self.plan.options.heartbeat_timeout_s,
            engine=self.plan.options.engine,
            ranks_per_task=ranks_per_task,
            gpus_per_task=self.plan.gpu_plan.per_task,
            gpu_resource_name=self.plan.gpu_plan.resource_name,
            relay=channel.relay.spec if channel.relay is not None else None,
        )

    def _relay(self) -> _relay.RelaySpec | None:
        """None for ``never``; in ``auto`` only where an object store is named."""
        mode = self.plan.options.relay
        if mode == "never":
            return None
        if mode == "auto" and not (s3_endpoint() or os.environ.get(c.HVDFLOW_BUCKET)):
            return None
        return _relay.relay_spec(self.run_id, always=mode == "always")

    def _task_layout(self, conf) -> tuple[int, tuple[int, ...] | None]:
        """Barrier tasks for the np ranks, and ranks each (None: one); k per task of k GPUs."""
        gpus = task_gpu_amount(conf, self.plan.gpu_plan.resource_name)
        if self.plan.gpu_plan.per_task is not None or gpus is None or gpus <= 1:
            return self.plan.np, None
        per_task = int(gpus)
        tasks = math.ceil(self.plan.np / per_task)
        layout = tuple(_engines.split_evenly(self.plan.np, tasks))
        if self.plan.np % per_task:
            logger.warning(
                "np=%d is not a multiple of the %d GPUs each task holds "
                "(spark.task.resource.%s.amount): %d tasks run %s ranks, leaving GPUs idle",
                self.plan.np,
                per_task,
                self.plan.gpu_plan.resource_name,
                tasks,
                "/".join(map(str, layout)),
            )
        return tasks, layout

    def _run_on_spark(self, payload: bytes, sink: RunLog) -> bytes | None:
        from hvdflow.infra.spark import get_spark  # noqa: PLC0415 (loads Spark)

        spark = self.plan.options.spark or get_spark()
        self._require_engine(spark)
        conf = spark.conf
        errors.refuse_unencrypted(conf, self.plan.face, self.plan.ignore_ssl_conf)
        if self.plan.layout is not None:
            tasks, ranks_per_task = len(self.plan.layout), self.plan.layout
        else:
            tasks, ranks_per_task = self._task_layout(conf)
        asked = self.plan.asked or (
            f"np={self.plan.np}" + (f" ({tasks} tasks of several GPUs)" if ranks_per_task else "")
        )
        wait_for_slots(spark, tasks, self.plan.options.slot_wait_s, asked, self.plan.size_argument)
        # Slots not countable (Connect) or gone since: Spark refuses the stage within seconds,
        # while an executor killed moments ago comes back. Resubmit while slot_wait_s lasts.
        deadline = time.monotonic() + self.plan.options.slot_wait_s
        refusals = 0
        while True:
            try:
                return self._barrier_job(spark, payload, sink, tasks, ranks_per_task)
            except errors.SparkJobFailed as e:
                if not refused_for_slots(e):
                    raise
                if time.monotonic() >= deadline:
                    raise errors.SparkJobFailed(
                        f"{e} It was refused {refusals + 1} time(s) over "
                        f"{self.plan.options.slot_wait_s:g} s (slot_wait_s): lower "
                        f"{self.plan.size_argument}, or add executors or cores"
                    ) from None
                if not refusals:
                    logger.warning(
                        "%s: Spark refused the barrier stage for want of %d task slots (its "
                        "executors may be coming back); submitting it again each %g s for up "
                        "to %g s (slot_wait_s)",
                        asked,
                        tasks,
                        RESUBMIT_EVERY_S,
                        self.plan.options.slot_wait_s,
                    )
                refusals += 1
                time.sleep(RESUBMIT_EVERY_S)

    def _barrier_job(
        self, spark, payload: bytes, sink: RunLog, tasks: int, ranks_per_task
    ) -> bytes | None:
        from hvdflow.infra.spark import client_address  # noqa: PLC0415 (loads Spark)

        with DriverChannel(
            client_address(spark),
            sink,
            relay=self._relay(),
            slots=abs(self.plan.np),
        ) as channel:
            spec = self._spec(payload, channel, ranks_per_task)
            tag = f"hvdflow-{self.run_id}"
            done, outcome = _in_thread(
                lambda: run_barrier_stage(spark, spec, tasks, tag), "hvdflow-barrier-job"
            )
            logger.info(
                "%s: %d ranks in %d barrier task(s), Spark job tag %s",
                self.plan.face,
                self.plan.np,
                tasks,
                tag,
            )
            self._wait(
                done,
                channel,
                sink,
                cancel=lambda: spark.interruptTag(tag),
                ended_badly=lambda: "error" in outcome,
            )
            if "error" in outcome:
                raise errors.SparkJobFailed(
                    f"{self._name()}: the Spark job that ran the {self.plan.np} ranks failed: "
                    f"{errors.first_line(outcome['error'])}"
                ) from None
            return outcome["result"]

    def _run_on_driver(self, payload: bytes, sink: RunLog) -> bytes | None:
        """The ranks as one task on the driver: processes of this machine, no Spark."""
        n = -self.plan.np
        plan = self.plan.gpu_plan
        gpus = plan.driver_gpus
        gpus = list(gpus) if gpus is not None else _engines.driver_gpu_addresses()
        if plan.per_task is None and 0 < len(gpus) < n:
            logger.warning(
                "np=%d on a driver with %d GPU(s): ranks share them (one per rank is best)",
                self.plan.np,
                len(gpus),
            )
        with DriverChannel("127.0.0.1", sink) as channel:
            # A worker per task (per_task) runs alone; HorovodRunner's ranks run together.
            layout = self.plan.layout or (None if plan.per_task is not None else (n,))
            spec = self._spec(payload, channel, layout)
            done, outcome = _in_thread(
                lambda: _task.run_task(spec, 0, ["127.0.0.1"], gpus, all_gather=lambda m: [m]),
                "hvdflow-driver-task",
            )
            self._wait(
                done, channel, sink, cancel=lambda: None, ended_badly=lambda: "error" in outcome
            )
            error = outcome.get("error")
            if isinstance(error, errors.RankFailed):
                raise errors.rank_failed(f"{self._name()}: {error}", error.cause)
            if error is not None:
                raise RuntimeError(f"{self._name()}: {error}") from None
            return outcome.get("result")

    def _report_lost(self, channel: DriverChannel, sink: RunLog) -> None:
        for lost in channel.liveness.lost(self.plan.options.heartbeat_timeout_s):
            channel.report({**lost, "tail": sink.tail(lost["rank"])})

    def _wait(
        self,
        done: threading.Event,
        channel: DriverChannel,
        sink: RunLog,
        cancel: Callable[[], None],
        ended_badly: Callable[[], bool],
    ) -> None:
        """Wait for the ranks; on a failure, a lost task, a timeout or Ctrl-C stop all, raise."""
        started = time.monotonic()
        timeout_s, stall_s = self.plan.options.timeout_s, self.plan.options.stall_timeout_s
        try:
            while not done.wait(_POLL_S):
                self._report_lost(channel, sink)
                if stall_s and channel.progress.stalled(stall_s):
                    channel.report(self._stall_report(channel))
                if channel.failed.is_set():
                    break
                if timeout_s is not None and time.monotonic() - started > timeout_s:
                    self._stop(done, channel, cancel)
                    raise TimeoutError(
                        f"{self._name()} did not finish within {timeout_s:g} s "
                        "(LaunchOptions.timeout_s): raise timeout_s or shorten the run"
                    )
        except KeyboardInterrupt:
            logger.warning("interrupted: stopping the %d ranks", abs(self.plan.np))
            self._stop(done, channel, cancel)
            raise
        if ended_badly() and not channel.failed.is_set():
            # A task reports before it raises: let the report land, to name the rank.
            channel.failed.wait(1.0)
        if channel.failed.is_set():
            # Collect the others' reports, to name the rank that caused it, not the first.
            channel.gather_failures(
                abs(self.plan.np), _SETTLE_S, on_poll=lambda: self._report_lost(channel, sink)
            )
            self._stop(done, channel, cancel)
            failure, others = channel.root_failure()
            lines = failure.get("tail") or sink.tail(failure["rank"])
            tail = "\n".join(lines) or "(it wrote no output)"
            also = f" (then rank(s) {', '.join(map(str, others))} failed too)" if others else ""
            stalled = failure.get("cause") == _wire.CAUSE_STALLED
            heading = errors.STACKS_HEADING if stalled else errors.OUTPUT_HEADING
            what = _decisions.error_line(lines)
            raise errors.rank_failed(
                f"{self._name()}: {failure['reason']}{also}{f': {what}' if what else ''}. "
                f"{heading}\n{tail}",
                failure.get("cause"),
            )
        if not ended_badly() and not channel.drain(_DRAIN_S):
            logger.warning(
                "a task's connection was still open %g s after the ranks ended: its last "
                "lines may be missing from the log",
                _DRAIN_S,
            )

    def _stall_report(self, channel: DriverChannel) -> dict:
        """Gather every rank's stacks (seconds at most), then describe the stall."""
        progress, _hosts = channel.progress.snapshot()
        stall_s = self.plan.options.stall_timeout_s
        logger.warning(
            "ranks %s finished no batch for %g s (stall_timeout_s): collecting their stacks",
            channel.progress.stalled(stall_s),
            stall_s,
        )
        channel.request_stacks()
        deadline = time.monotonic() + _STACKS_WAIT_S
        while time.monotonic() < deadline and not set(progress) <= set(channel.stacks):
            time.sleep(0.1)
        progress, hosts = channel.progress.snapshot()
        return _decisions.stall_report(progress, stall_s, dict(channel.stacks), hosts, time.time())

    def _stop(self, done: threading.Event, channel: DriverChannel, cancel: Callable[[], None]):
        channel.abort()
        try:
            cancel()
        except Exception:  # the Spark job may already be gone
            logger.debug("cancelling the Spark job failed", exc_info=True)
        if not done.wait(_STOP_GRACE_S):
            logger.warning(
                "ranks still stopping after %.0f s (hvdflow.infra.launcher._driver._STOP_GRACE_S); "
                "each task kills its rank when it sees the run cancelled",
                _STOP_GRACE_S,
            )
