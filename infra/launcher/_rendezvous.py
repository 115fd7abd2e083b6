"""Who may use the Gloo rendezvous store on the driver: the decision (pure) and the server.

The rendezvous server answers only the hosts of the run's plan, and its keys are write-once
(see ``decide`` and the threat model below). ``_driver.DriverChannel`` starts one per run.
"""

from __future__ import annotations

import ipaddress
import logging
import socket
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from horovod.runner.http.http_server import RendezvousHandler, RendezvousHTTPServer

logger = logging.getLogger(__name__)

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
# How long a GET for a key not written yet waits for its PUT before it is answered 404. Gloo's
# HTTP store asks again 10 ms after each 404 (HTTPStore::wait in horovod/common/gloo/
# http_store.cc): every rank that reaches hvd.init() before the slowest polls this one Python
# server at 100 Hz for as long as that rank is late (1,700-1,900 requests for one np=8
# rendezvous on one host; docs/benchmarks/cluster.md, "Eight hosts"). Held, a missing key
# costs a request a second and is answered the moment it is written. Gloo's client sets no
# timeout on a request.
LONG_POLL_S = 1.0


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
    # Horovod's own RendezvousServer binds every interface on a random port; this one binds the
    # executor-facing address only, on a port the OS picks, and answers only the plan's hosts.
    daemon_threads = True
    # Every Gloo request is a connection of its own, and np ranks open theirs at once: with
    # socketserver's default backlog of 5, the sixth and later SYNs are dropped and sent again
    # after TCP's 1 s timeout, once per rendezvous scope (6 s of hvd.init() at np=8 here).
    request_queue_size = socket.SOMAXCONN

    def __init__(self, address, handler, verbose):
        super().__init__(address, handler, verbose)
        self.allowed: frozenset[str] = frozenset()
        self.counted: set[tuple[str, str]] = set()
        self.counted_lock = threading.Lock()
        self._warned: set[tuple[str, int]] = set()
        # Signalled (under the store's own lock) whenever a key is written: held GETs wake.
        self.key_written = threading.Condition(self.cache_lock)

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
