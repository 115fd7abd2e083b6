"""Horovod's Gloo rendezvous for one run, served by rank 0's task on its own host
(``TaskRendezvous``): who may use it (pure, ``decide``; the threat model below) and the server.
Nothing listens on the driver, so a Spark Connect client needs neither Horovod nor an inbound
connection.
"""

from __future__ import annotations

import ipaddress
import logging
import socket
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from horovod.runner.http.http_server import RendezvousHandler, RendezvousHTTPServer

logger = logging.getLogger(__name__)

# Threat model. Ranks PUT their Gloo address under /<scope>/<rank>, GET their peers', and DELETE
# their key when done with a scope. Overwriting a key decides whom a rank connects to (so which
# gradients it averages); DELETEs can make a scope look finished early. Gloo's C++ client cannot
# add a header, so the channel token cannot travel with it. The server therefore:
#   1. answers only the plan's task hosts: 403 for others (the plan comes from the stage itself,
#      ``BarrierTaskContext.getTaskInfos()``, before the server starts);
#   2. takes only GET, PUT and DELETE on /<scope>/<key> (Horovod's inherited HEAD lists files);
#   3. keeps keys write-once: 409 for other bytes (the same again succeed), so a stranger's PUT
#      fails the run, never redirects a rank;
#   4. counts a DELETE only for a rank number within the scope's size, once per run.
# Not covered: other processes on a planned host, and forged source addresses.

RENDEZVOUS_METHODS = ("GET", "PUT", "DELETE")
# Largest value one PUT may store: a rank's Gloo addresses take tens of bytes per peer.
RENDEZVOUS_MAX_VALUE_BYTES = 1024 * 1024
# How long a GET for a key not written yet waits for its PUT before a 404. Gloo asks again 10 ms
# after each 404, so early ranks would poll this Python server at 100 Hz; held, a missing key
# costs a request a second and is answered once written. Gloo sets no request timeout.
LONG_POLL_S = 1.0

# What the warning adds when the server refuses a client that is not in the plan.
NOT_PLANNED_HINT = (
    "If that is one of this run's executors, it connects from another address than the one "
    "Spark reports for it: set SPARK_LOCAL_IP on that worker to its address on the cluster's "
    "network"
)


@dataclass(frozen=True)
class Decision:
    """Apply one request, or (``applied`` False) answer ``status`` for ``reason`` and ``hint``."""

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
    return str(ip.ipv4_mapped if ip.version == 6 and ip.ipv4_mapped is not None else ip)


def allowed_clients(
    task_hosts: Iterable[str], resolve: Callable[[str], Iterable[str]]
) -> frozenset[str]:
    """The addresses of the plan's task hosts (``resolve`` lists a host's)."""
    hosts = sorted(set(task_hosts))
    return frozenset(normalize_address(address) for host in hosts for address in resolve(host))


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
    """Whether the server applies one request. ``allowed``: empty before the plan; ``scope_sizes``:
    ranks per scope; for a PUT, ``stored`` is the key's value and ``body`` the new one (None: not
    read yet); ``counted``: the (scope, key) DELETEs already counted."""
    client = normalize_address(client)
    if client not in allowed:
        if not allowed:
            return Decision(403, f"{client} asked before the run's plan was known", False)
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


def addresses_of(host: str) -> list[str]:
    try:
        return [info[4][0] for info in socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)]
    except OSError as e:
        logger.warning(
            "task host %r does not resolve (%s): the rendezvous server will refuse its ranks",
            host,
            e,
        )
        return []


class RendezvousServer(RendezvousHTTPServer):
    # Unlike Horovod's (every interface), binds only the address its task host has in the plan.
    daemon_threads = True
    # Each Gloo request is its own connection, np at once: a backlog of 5 drops later SYNs for
    # TCP's 1 s retry, once per scope.
    request_queue_size = socket.SOMAXCONN

    def __init__(self, address, handler, verbose):
        super().__init__(address, handler, verbose)
        self.allowed: frozenset[str] = frozenset()
        self.counted: set[tuple[str, str]] = set()
        self.counted_lock = threading.Lock()
        self._warned: set[tuple[str, int]] = set()
        # Notified (under the store's lock) when a key is written: held GETs wake.
        self.key_written = threading.Condition(self.cache_lock)

    def refused(self, client: str, method: str, path: str, decision: Decision) -> None:
        """The first refusal per client and status is a warning, the rest debug."""
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


class GuardedHandler(RendezvousHandler):
    """Horovod's rendezvous handler behind ``decide``."""

    server: RendezvousServer

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
        _, scope, key = self.path.split("/")
        with self.server.key_written:  # a key not written yet: wait for it (LONG_POLL_S)
            self.server.key_written.wait_for(
                lambda: key in self.server.cache.get(scope, {}), timeout=LONG_POLL_S
            )
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
                "PUT", Decision(413, f"{length} bytes (RENDEZVOUS_MAX_VALUE_BYTES)", False)
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
                self.server.key_written.notify_all()
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


class TaskRendezvous:
    """The run's rendezvous on ``host`` (rank 0's task host) for the ranks on ``rank_hosts``
    (``_engines.rank_hosts``), served from a thread until ``close()``; ``port``: where."""

    def __init__(self, host: str, rank_hosts: Sequence[str], plan):
        """``plan``: Horovod's slots for ``rank_hosts`` (``_engines.host_alloc_plan``)."""
        self.server = RendezvousServer((host, 0), GuardedHandler, 0)
        self.server.init(plan)
        self.server.allowed = allowed_clients(rank_hosts, resolve=addresses_of)
        self.port = self.server.server_address[1]
        # A short poll interval: shutdown() waits up to one, at the end of every run.
        self._thread = threading.Thread(
            target=self.server.serve_forever, args=(0.05,), daemon=True, name="hvdflow-rendezvous"
        )
        self._thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
