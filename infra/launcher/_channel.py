"""Driver side of a HorovodRunner run: the Gloo rendezvous server and the tasks' channel.

Both listen only on the address executors use to reach the driver. Tasks must present the run's
random token before anything they send is believed; the token is never logged. A connection that
says nothing within HELLO_TIMEOUT_S, or sends a message over its size cap, is closed.
"""

from __future__ import annotations

import logging
import secrets
import socket
import socketserver
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from horovod.runner.http.http_server import RendezvousHandler, RendezvousHTTPServer

from infra.launcher import _wire
from infra.launcher._placement import host_alloc_plan

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


class _RendezvousHTTPServer(RendezvousHTTPServer):
    # Horovod's own RendezvousServer binds every interface on a random port; this one binds the
    # executor-facing address only, on a port the OS picks.
    daemon_threads = True


class DriverChannel:
    """Accepts task connections, collects rank output and failures, and can abort every task."""

    def __init__(self, bind_host: str, on_line: Callable[[_wire.LogLine], None]):
        self.bind_host = bind_host
        self.token = secrets.token_hex(16)
        self._on_line = on_line
        self._lock = threading.Lock()
        self._connections: list[_wire.Connection] = []
        self.failures: list[dict] = []
        self.failed = threading.Event()
        self._closed = False

        self._rendezvous = _RendezvousHTTPServer((bind_host, 0), RendezvousHandler, 0)
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
            if self._closed:
                conn.close()
                return
            self._connections.append(conn)
        while (message := conn.receive()) is not None:
            self._dispatch(conn, message)

    def _dispatch(self, conn: _wire.Connection, message: dict) -> None:
        kind = message.get("type")
        if kind == _wire.LINE:
            line = _wire.LogLine(
                message["time"], message["rank"], message["stream"], message["text"]
            )
            try:
                self._on_line(line)
            except Exception:  # a consumer's bug must not stop the stream
                logger.exception("a rank output consumer failed on %s", line.formatted())
        elif kind == _wire.PLAN:
            self._rendezvous.init(host_alloc_plan(message["hosts"]))
            logger.debug("rendezvous initialised for hosts %s", message["hosts"])
            conn.send({"type": _wire.PLAN_OK})
        elif kind == _wire.FAILED:
            with self._lock:
                self.failures.append(message)
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
