"""Driver side of a HorovodRunner run: the Gloo rendezvous server and the tasks' channel.

The rendezvous server is Horovod's (``_rendezvous``), started only for the horovod engine: a
tf_collective run's workers meet at the endpoints the tasks gather, and need no Horovod here.
Both listen only on the address executors use to reach the driver. Tasks must present the run's
random token before anything they send is believed; the token is never logged. A connection that
says nothing within HELLO_TIMEOUT_S, or sends a message over its size cap, is closed. The
rendezvous server answers only the hosts of the run's plan, and its keys are write-once
(``_rendezvous``).
"""

from __future__ import annotations

import logging
import secrets
import socket
import socketserver
import threading
import time
from collections.abc import Callable, Mapping
from functools import partial

from hvdflow.infra.launcher import _liveness, _stall, _wire
from hvdflow.infra.launcher._decisions import root_failure
from hvdflow.infra.launcher._placement import host_alloc_plan
from hvdflow.infra.launcher._relay import DriverRelay, RelaySpec

logger = logging.getLogger(__name__)

# How long a new connection may take to send its hello: a stranger that connects and says
# nothing must not hold a server thread for the rest of the run.
HELLO_TIMEOUT_S = 10.0
# Longest hello accepted: a token and a partition number. Nothing bigger is read unauthenticated.
HELLO_MAX_BYTES = 1024


class DriverChannel:
    """Accepts task connections, collects rank output and failures, and can abort every task."""

    def __init__(
        self,
        bind_host: str,
        on_line: Callable[[_wire.LogLine], None],
        *,
        rendezvous: bool = True,
        relay: RelaySpec | None = None,
        slots: int | None = None,
    ):
        """``rendezvous``: start Horovod's Gloo rendezvous server (the horovod engine's ranks
        meet there); without it ``rendezvous_port`` is 0. ``relay``: also serve the tasks that
        reach the driver through the object store (``_relay``); ``slots``: how many rank slots
        will connect (the relay stops listening once all have, directly)."""
        self.bind_host = bind_host
        self.relay: DriverRelay | None = None  # started last, below
        self.token = secrets.token_hex(16)
        self._on_line = on_line
        self._lock = threading.Lock()
        self._connections: list[_wire.Connection] = []
        # Connections whose messages are still being read; ``drain`` waits for them to end.
        self._reading = 0
        self._drained = threading.Condition(self._lock)
        self.failures: list[dict] = []
        self.failed = threading.Event()
        self._closed = False
        # When each task was last heard from: a silent one is lost (runner's heartbeat_timeout_s).
        self.liveness = _liveness.Tracker()
        # How far each rank has got: a rank that stops stalls the run (runner's stall_timeout_s).
        self.progress = _stall.ProgressTracker()
        self.stacks: dict[int, str] = {}
        # The task hosts of the run's plan, once the first task sent them (every task does).
        self._plan: list[str] | None = None
        # The exchange (GATHER): each task's part by partition, and who waits for the whole.
        self._parts: dict[int, str] = {}
        self._gatherers: list[_wire.Connection] = []

        self._rendezvous = None
        self._allowed_clients = None  # the rendezvous module's, with the server
        self.rendezvous_port = 0
        self._server = _ChannelServer((bind_host, 0), self._handler_class())
        self.port = self._server.server_address[1]
        servers: list[tuple[socketserver.BaseServer, str]] = [(self._server, "driver-channel")]
        if rendezvous:
            # Horovod's HTTP server, loaded only where a run uses Horovod (no TensorFlow).
            from hvdflow.infra.launcher import _rendezvous  # noqa: PLC0415

            self._rendezvous = _rendezvous.RendezvousServer(
                (bind_host, 0), _rendezvous.GuardedHandler, 0
            )
            self._allowed_clients = partial(
                _rendezvous.allowed_clients, resolve=_rendezvous.addresses_of
            )
            self.rendezvous_port = self._rendezvous.server_address[1]
            servers.append((self._rendezvous, "rendezvous"))
        self._servers = [server for server, _ in servers]
        self._threads = [
            # A short poll interval: shutdown() waits up to one interval, at the end of every run.
            threading.Thread(
                target=s.serve_forever, args=(0.05,), daemon=True, name=f"hvdflow-{name}"
            )
            for s, name in servers
        ]
        for t in self._threads:
            t.start()
        if relay is not None:
            self.relay = DriverRelay(relay, self._serve_connection, slots)

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
        """One task's messages until its connection ends: a socket's, or a relay's (``conn`` has
        ``_wire.Connection``'s send, receive and close)."""
        hello = conn.receive(limit=HELLO_MAX_BYTES)
        if not isinstance(hello, dict) or hello.get("type") != _wire.HELLO:
            logger.warning(
                "closed a connection to the driver channel that sent no hello within %g s "
                "(HELLO_TIMEOUT_S) and %d bytes (HELLO_MAX_BYTES)",
                HELLO_TIMEOUT_S,
                HELLO_MAX_BYTES,
            )
            conn.close()
            return
        if not secrets.compare_digest(str(hello.get("token", "")), self.token):
            logger.warning("rejected a connection to the driver channel with a wrong token")
            conn.close()
            return
        after_hello()
        if self.relay is not None:
            if not hello.get("relayed"):
                self.relay.joined_directly(hello.get("partition"))
            else:  # a relayed hello can only come through the relay this run offered
                logger.info(
                    "rank slot %s on %s reaches the driver through the object store (%s): %s",
                    hello.get("partition"),
                    str(hello.get("hostname", ""))[: _wire.MAX_HOSTNAME_CHARS],
                    self.relay.spec.uri,
                    str(hello.get("relayed"))[:300],
                )
        with self._lock:
            if self._closed or self.failed.is_set():
                # A task of a run that already failed: Spark re-running the barrier stage
                # (spark.task.maxFailures). Its ranks would train beside the training step's
                # own retry (launcher.retries, which resumes from the checkpoint): refuse it.
                logger.warning(
                    "refused a task of partition %s: this run has already failed (Spark "
                    "re-running the barrier stage); the caller's retry resumes instead",
                    hello.get("partition"),
                )
                conn.close()
                return
            self._connections.append(conn)
            self._reading += 1
        self.liveness.join(conn, hello.get("partition"), hello.get("hostname"))
        hostname = str(hello.get("hostname", ""))[: _wire.MAX_HOSTNAME_CHARS]
        said_bye, driver_error = False, None
        try:
            while (message := conn.receive()) is not None:
                said_bye = message.get("type") == _wire.BYE
                self._dispatch(conn, message, hostname)
        except BaseException as error:
            # Said here: its thread would end in silence (socketserver prints an exception on
            # stderr, which may have no reader, and nothing at all for SystemExit).
            logger.exception("the driver stopped reading rank slot %s", hello.get("partition"))
            driver_error = error
            raise
        finally:
            # A task that ends on its own says bye; one that does not died (its executor,
            # worker or host), unless the driver closed it (abort) or failed reading it.
            report = self.liveness.leave(
                conn, vanished=not said_bye and not self._closed, driver_error=driver_error
            )
            if report is not None:
                self.report(report)
            with self._drained:
                self._reading -= 1
                self._drained.notify_all()

    def drain(self, timeout_s: float) -> bool:
        """Wait until every task has closed its connection, all it sent read; False on timeout.

        A task closes its connection after shipping its rank's last lines and before Spark
        returns its result, but the result can reach the driver first: closing the channel
        then would drop those lines. A successful run drains before it closes.
        """
        with self._drained:
            return self._drained.wait_for(lambda: self._reading == 0, timeout_s)

    def _dispatch(self, conn: _wire.Connection, message: dict, hostname: str = "") -> None:
        kind = message.get("type")
        self.liveness.seen(conn)  # any message is a sign of life
        if kind == _wire.HEARTBEAT:
            if "progress" in message:
                self.progress.update(message["progress"], hostname)
            try:
                conn.send({"type": _wire.HEARTBEAT})
            except OSError:  # the task is gone: its connection ends next
                pass
        elif kind == _wire.LINE:
            line = _wire.LogLine(
                message["time"], message["rank"], message["stream"], message["text"]
            )
            try:
                self._on_line(line)
            # A consumer's bug must not stop the stream; nor its SystemExit, which in this
            # thread would end the task's connection, not the process (Rich raises one on a
            # broken pipe: hvdflow.infra.stdio).
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
        """Every task sends the plan (the same hosts: its stage's task infos) and starts its
        ranks once answered. The first starts the run; the answer to each comes after that, so
        no rank reaches the rendezvous server before it knows the plan. Only a task that
        presented the token gets here: the plan decides who the rendezvous server answers."""
        with self._lock:
            first, planned = self._plan is None, self._plan
            if first:
                self._plan = hosts
                if self._rendezvous is not None:
                    self._rendezvous.start_run(
                        host_alloc_plan(hosts), self._allowed_clients(hosts, self.bind_host)
                    )
                    logger.debug("rendezvous initialised for hosts %s", hosts)
                self.liveness.plan(hosts)
        if not first and planned != hosts:
            # Tasks of one stage see the same task infos: left unanswered, the task says the
            # driver did not accept its plan.
            logger.error("a task sent the rank plan %s after %s: not accepted", hosts, planned)
            return
        conn.send({"type": _wire.PLAN_OK})

    def _gather(self, conn: _wire.Connection, partition: int, tasks: int, part: str) -> None:
        """The engines' one exchange among the tasks (tf_collective's endpoints, torch's
        master), as Spark's ``BarrierTaskContext.allGather`` would do it but without its
        once-a-second wake-up: once every task sent its part, each gets them all."""
        with self._lock:
            self._parts[partition] = part
            self._gatherers.append(conn)
            if len(self._parts) < tasks:
                return
            parts = [self._parts[p] for p in sorted(self._parts)]
            waiting, self._gatherers = self._gatherers, []
        for waiter in waiting:
            try:
                waiter.send({"type": _wire.GATHERED, "parts": parts})
            except OSError:  # that task is gone: its connection ends next
                pass

    def request_stacks(self) -> None:
        """Ask every task for its rank's Python stacks; they arrive in ``stacks``."""
        with self._lock:
            self.stacks.clear()
            connections = list(self._connections)
        for conn in connections:
            try:
                conn.send({"type": _wire.DUMP_STACKS})
            except OSError:  # that task is gone: its rank's stacks will be missing
                pass

    def report(self, failure: dict) -> None:
        """Record a failure report (a task's, or the driver's own about a lost task)."""
        with self._lock:
            self.failures.append(failure)
        self.failed.set()

    def gather_failures(
        self, expected: int, within_s: float, on_poll: Callable[[], None] = lambda: None
    ) -> None:
        """After a first failure, wait up to ``within_s`` for the other reports: until
        ``expected`` came, or no task's connection is still open (none can report any more).
        ``on_poll`` runs between waits (the runner's check for silent tasks).

        Not only until the Spark job ends: Spark can hear from its master that a host's
        executor is gone, and end the job, before this channel has read that the host's task
        connection ended. The report of that lost task is what keeps a peer's "Horovod has
        been shut down" from being named as the cause (seen in CI: a host lost for good was
        blamed on a surviving rank, and the run was not resumed on the ranks left).
        """
        deadline = time.monotonic() + within_s
        while len(self.failures) < expected and time.monotonic() < deadline:
            on_poll()
            # A connection's last report is recorded before it stops counting as read.
            if self.drain(0.05):
                return

    def root_failure(self) -> tuple[Mapping | None, list[int]]:
        """``root_failure`` of the reports received so far."""
        with self._lock:
            failures = list(self.failures)
        return root_failure(failures)

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
        for server in self._servers:
            server.shutdown()
            server.server_close()
        for t in self._threads:
            t.join(timeout=5)

    def __enter__(self) -> DriverChannel:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class _ChannelServer(socketserver.ThreadingTCPServer):
    daemon_threads = True
    # np tasks connect at once; socketserver's default backlog of 5 drops the sixth and later
    # SYNs, which TCP sends again only after 1 s (as for the rendezvous server).
    request_queue_size = socket.SOMAXCONN
