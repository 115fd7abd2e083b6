"""Driver side of a HorovodRunner run: the Gloo rendezvous server and the tasks' channel.

Both listen only on the address executors use to reach the driver. Tasks must present the run's
random token before anything they send is believed; the token is never logged. A connection that
says nothing within HELLO_TIMEOUT_S, or sends a message over its size cap, is closed. The
rendezvous server answers only the hosts of the run's plan, and its keys are write-once (see
``decide``).
"""

from __future__ import annotations

import ipaddress
import logging
import secrets
import socket
import socketserver
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from horovod.runner.http.http_server import RendezvousHandler, RendezvousHTTPServer

from hvdflow.infra.launcher import _liveness, _stall, _wire
from hvdflow.infra.launcher._placement import host_alloc_plan

logger = logging.getLogger(__name__)

# What Horovod prints in the ranks that fail only because another rank died first.
HOROVOD_SHUTDOWN = "Horovod has been shut down"
# How long a new connection may take to send its hello: a stranger that connects and says
# nothing must not hold a server thread for the rest of the run.
HELLO_TIMEOUT_S = 10.0
# Longest hello accepted: a token and a partition number. Nothing bigger is read unauthenticated.
HELLO_MAX_BYTES = 1024


def root_failure(failures: Sequence[Mapping[str, Any]]) -> tuple[Mapping | None, list[int]]:
    """The failure report that caused the others, and the ranks of the others, sorted.

    Each report has ``rank``, ``reason``, ``tail`` (its last output lines) and ``exited_at``.
    When one rank dies, its peers fail in their next collective with Horovod's "has been shut
    down" message, sometimes before the first report arrives: prefer a failure that is not such
    a consequence, then the earliest exit.
    """
    if not failures:
        return None, []

    def consequence(failure: Mapping[str, Any]) -> bool:
        return any(HOROVOD_SHUTDOWN in line for line in failure.get("tail") or [])

    ordered = sorted(failures, key=lambda f: (consequence(f), f.get("exited_at", 0.0)))
    root = ordered[0]
    return root, sorted({f["rank"] for f in ordered[1:]} - {root["rank"]})


# --- Who may use the Gloo rendezvous store ----------------------------------------------------
#
# Threat model. The rendezvous server is an HTTP key-value store on the driver. Each rank PUTs its
# Gloo address under /<scope>/<rank>, GETs its peers' addresses from there, and DELETEs its key to
# say it has finished the scope (horovod/common/gloo/http_store.cc; the scopes are ``global``,
# ``local_<host>``, ``cross_<local rank>``, and others for process sets). Whoever can overwrite a
# key decides whom a rank connects to, and so which gradients it averages; whoever can DELETE keys
# can make a scope look finished and cleared before its ranks have read it. Gloo's C++ client sends
# bare GET, PUT and DELETE requests and cannot add a header, so the channel token cannot travel
# with them. The server therefore:
#   1. answers only the addresses of the task hosts in the run's plan, and the driver's own. The
#      plan comes from partition 0 over the channel, after its token; until it arrives nobody is
#      answered. A stranger anywhere else gets 403 for every request.
#   2. takes only GET, PUT and DELETE on /<scope>/<key>. (Horovod's handler also inherits HEAD from
#      SimpleHTTPRequestHandler, which would describe files in the driver's working directory.)
#   3. keeps keys write-once for the run: a PUT to a key that holds other bytes gets 409, so nothing
#      can replace a rank's address once the rank wrote it (a rank's retried PUT of the same bytes
#      succeeds). A process that writes a key before its rank does makes that rank's PUT fail: the
#      run fails loudly, the rank is never redirected.
#   4. counts a DELETE only for a rank number within the scope's size, once per run.
# Not covered: other processes on a planned host (they share the ranks' address; see 3), and an
# attacker who can forge source addresses on the driver's network.

RENDEZVOUS_METHODS = ("GET", "PUT", "DELETE")
# Largest value one PUT may store: a rank's Gloo addresses take tens of bytes per peer.
RENDEZVOUS_MAX_VALUE_BYTES = 1024 * 1024


# What the driver's warning adds when it refuses a client that is not in the plan.
NOT_PLANNED_HINT = (
    "If that is one of this run's executors, it connects from another address than the one "
    "Spark reports for it: set SPARK_LOCAL_IP on that worker to its address on the driver's "
    "network"
)


@dataclass(frozen=True)
class Decision:
    """What the rendezvous server does with one request: applies it, or answers ``status`` and
    changes nothing (``applied`` False), for ``reason``; ``hint`` is what to do about it."""

    status: int
    reason: str = ""
    applied: bool = True
    hint: str = ""


ACCEPT = Decision(200)


def normalize_address(address: str) -> str:
    """An IP address as ``ipaddress`` writes it; an IPv4-mapped IPv6 address as plain IPv4."""
    try:
        ip = ipaddress.ip_address(address.split("%", 1)[0])
    except ValueError:
        return address
    if ip.version == 6 and ip.ipv4_mapped is not None:
        return str(ip.ipv4_mapped)
    return str(ip)


def allowed_clients(
    task_hosts: Iterable[str], driver_host: str, resolve: Callable[[str], Iterable[str]]
) -> frozenset[str]:
    """The addresses the rendezvous server answers: those of the plan's task hosts and of the
    driver's own address (``resolve(host)`` lists a host's addresses)."""
    found: set[str] = set()
    for host in sorted({*task_hosts, driver_host}):
        found.update(normalize_address(address) for address in resolve(host))
    return frozenset(found)


def decide(
    method: str,
    path: str,
    client: str,
    allowed: frozenset[str],
    *,
    scope_sizes: Mapping[str, int] | None = None,
    stored: bytes | None = None,
    body: bytes | None = None,
    counted: frozenset[tuple[str, str]] | set[tuple[str, str]] = frozenset(),
) -> Decision:
    """Whether the rendezvous server applies one request (see the threat model above).

    ``client``: the address it came from; ``allowed``: ``allowed_clients`` of the plan (empty
    before the plan). ``scope_sizes``: ranks per planned scope. For a PUT, ``stored`` is what the
    key holds now and ``body`` the new value (``None``: not read yet). ``counted``: the
    (scope, key) DELETEs already counted in this run.
    """
    client = normalize_address(client)
    if client not in allowed:
        if not allowed:
            return Decision(403, f"{client} asked before the run's plan arrived", False)
        return Decision(
            403, f"{client} is not a task host of this run's plan", False, NOT_PLANNED_HINT
        )
    if method not in RENDEZVOUS_METHODS:
        return Decision(405, f"{method} is not a rendezvous request", False)
    parts = path.split("/")
    if len(parts) != 3 or parts[0] or not parts[1] or not parts[2]:
        return Decision(400, "expected a path /<scope>/<key>", False)
    _, scope, key = parts
    if method == "PUT" and body is not None and stored is not None and stored != body:
        return Decision(
            409, f"{scope}/{key} already holds another value: rendezvous keys are write-once", False
        )
    if method == "DELETE":
        size = (scope_sizes or {}).get(scope)
        if not key.isdigit() or (size is not None and int(key) >= size):
            ranks = f"0-{size - 1}" if size else "a rank number"
            return Decision(
                400, f"{scope}/{key}: a DELETE names a rank of the scope ({ranks})", False
            )
        if (scope, key) in counted:
            return Decision(200, f"rank {key} already finished {scope}", False)
    return ACCEPT


def _addresses_of(host: str) -> list[str]:
    try:
        return [info[4][0] for info in socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)]
    except OSError as e:
        logger.warning(
            "task host %r does not resolve (%s): the rendezvous server will refuse its ranks",
            host,
            e,
        )
        return []


class _RendezvousHTTPServer(RendezvousHTTPServer):
    # Horovod's own RendezvousServer binds every interface on a random port; this one binds the
    # executor-facing address only, on a port the OS picks, and answers only the plan's hosts.
    daemon_threads = True

    def __init__(self, address, handler, verbose):
        super().__init__(address, handler, verbose)
        self.allowed: frozenset[str] = frozenset()
        self.counted: set[tuple[str, str]] = set()
        self.counted_lock = threading.Lock()
        self._warned: set[tuple[str, int]] = set()

    def start_run(self, plan, allowed: frozenset[str]) -> None:
        """Horovod's ``init`` with the run's plan, and the addresses it may answer."""
        self.init(plan)
        with self.counted_lock:
            self.counted.clear()
        self.allowed = allowed

    def refused(self, client: str, method: str, path: str, decision: Decision) -> None:
        """Log a refusal: the first per client and status as a warning, the rest at debug."""
        key = (client, decision.status)
        with self.cache_lock:
            first = key not in self._warned
            self._warned.add(key)
        logger.log(
            logging.WARNING if first else logging.DEBUG,
            "rendezvous server refused %s %r from %s (HTTP %d): %s%s",
            method,
            path[:200],
            client,
            decision.status,
            decision.reason,
            f". {decision.hint}" if decision.hint else "",
        )


class _GuardedHandler(RendezvousHandler):
    """Horovod's rendezvous handler behind ``decide``."""

    server: _RendezvousHTTPServer

    def _decide(self, method: str, **state) -> Decision:
        return decide(
            method,
            self.path,
            self.client_address[0],
            self.server.allowed,
            scope_sizes=self.server.scope_size,
            **state,
        )

    def _refuse(self, method: str, decision: Decision) -> None:
        self.server.refused(self.client_address[0], method, self.path, decision)
        self.send_status_code(decision.status)

    def do_HEAD(self):
        self._refuse("HEAD", self._decide("HEAD"))

    def do_GET(self):
        decision = self._decide("GET")
        if not decision.applied:
            return self._refuse("GET", decision)
        super().do_GET()

    def do_PUT(self):
        decision = self._decide("PUT")
        if not decision.applied:  # a stranger's body is never read
            return self._refuse("PUT", decision)
        try:
            length = int(self.headers.get("Content-Length", ""))
        except ValueError:
            return self._refuse("PUT", Decision(411, "no Content-Length", False))
        if not 0 <= length <= RENDEZVOUS_MAX_VALUE_BYTES:
            return self._refuse(
                "PUT",
                Decision(413, f"{length} bytes (RENDEZVOUS_MAX_VALUE_BYTES)", False),
            )
        try:
            value = self.rfile.read(length)
        except TimeoutError:
            return self.send_status_code(408)
        _, scope, key = self.path.split("/")
        with self.server.cache_lock:
            stored = self.server.cache.get(scope, {}).get(key)
            decision = self._decide("PUT", stored=stored, body=value)
            if decision.applied:
                self.server.cache.setdefault(scope, {})[key] = value
        if not decision.applied:
            return self._refuse("PUT", decision)
        self.send_status_code(200)

    def do_DELETE(self):
        with self.server.counted_lock:
            decision = self._decide("DELETE", counted=self.server.counted)
            if decision.applied:
                _, scope, key = self.path.split("/")
                self.server.counted.add((scope, key))
        if decision.status == 200 and not decision.applied:  # a retried DELETE: done already
            return self.send_status_code(200)
        if not decision.applied:
            return self._refuse("DELETE", decision)
        super().do_DELETE()


class DriverChannel:
    """Accepts task connections, collects rank output and failures, and can abort every task."""

    def __init__(self, bind_host: str, on_line: Callable[[_wire.LogLine], None]):
        self.bind_host = bind_host
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

        self._rendezvous = _RendezvousHTTPServer((bind_host, 0), _GuardedHandler, 0)
        self.rendezvous_port = self._rendezvous.server_address[1]
        self._server = socketserver.ThreadingTCPServer((bind_host, 0), self._handler_class())
        self._server.daemon_threads = True
        self.port = self._server.server_address[1]
        self._threads = [
            # A short poll interval: shutdown() waits up to one interval, at the end of every run.
            threading.Thread(
                target=s.serve_forever, args=(0.05,), daemon=True, name=f"hvdflow-{name}"
            )
            for s, name in ((self._rendezvous, "rendezvous"), (self._server, "driver-channel"))
        ]
        for t in self._threads:
            t.start()

    def _handler_class(self):
        channel = self

        class Handler(socketserver.StreamRequestHandler):
            def handle(self):
                channel._serve(self.request)

        return Handler

    def _serve(self, sock: socket.socket) -> None:
        conn = _wire.Connection(sock)
        sock.settimeout(HELLO_TIMEOUT_S)
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
        # A task may stay silent for as long as its rank prints nothing: block from here on.
        sock.settimeout(None)
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
        try:
            while (message := conn.receive()) is not None:
                self._dispatch(conn, message, hostname)
        finally:
            self.liveness.leave(conn)
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
            except Exception:  # a consumer's bug must not stop the stream
                logger.exception("a rank output consumer failed on %s", line.formatted())
        elif kind == _wire.PLAN:
            hosts = list(message["hosts"])
            # Only a task that presented the token gets here: the plan it sends decides who
            # the rendezvous server answers.
            self._rendezvous.start_run(
                host_alloc_plan(hosts), allowed_clients(hosts, self.bind_host, _addresses_of)
            )
            logger.debug("rendezvous initialised for hosts %s", hosts)
            self.liveness.plan(hosts)
            conn.send({"type": _wire.PLAN_OK})
        elif kind == _wire.FAILED:
            self.report(message)
        elif kind == _wire.STACKS:
            rank, text = message.get("rank"), message.get("text")
            if isinstance(rank, int) and isinstance(text, str):
                with self._lock:
                    self.stacks[rank] = text[: _wire.MAX_STACKS_CHARS]

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
        for server in (self._server, self._rendezvous):
            server.shutdown()
            server.server_close()
        for t in self._threads:
            t.join(timeout=5)

    def __enter__(self) -> DriverChannel:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
