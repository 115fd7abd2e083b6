"""A stand-in for the driver's channel, for testing a task on its own."""

from __future__ import annotations

import socketserver
import threading
import time

from hvdflow.infra.launcher import _wire
from hvdflow.infra.launcher._task import TaskSpec


class SilentDriver(socketserver.ThreadingTCPServer):
    """Accepts a task, records what it sends, answers the plan, and otherwise says nothing."""

    daemon_threads = True
    allow_reuse_address = True

    def __init__(self):
        self.received: list[dict] = []
        server = self

        class Handler(socketserver.StreamRequestHandler):
            def handle(self):
                while (message := _wire.read_message(self.rfile)) is not None:
                    server.received.append(message)
                    if message.get("type") == _wire.PLAN:
                        self.wfile.write(_wire.encode({"type": _wire.PLAN_OK}))

        super().__init__(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.serve_forever, args=(0.05,), daemon=True).start()

    def messages(self, kind: str, within_s: float = 5.0) -> list[dict]:
        """The messages of type ``kind`` received, waiting up to ``within_s`` for a first one."""
        deadline = time.monotonic() + within_s
        while not (found := [m for m in self.received if m.get("type") == kind]):
            if time.monotonic() > deadline:
                break
            time.sleep(0.05)
        return found


def spec_for(driver: SilentDriver, payload: bytes, heartbeat_timeout_s: float) -> TaskSpec:
    return TaskSpec(
        payload=payload,
        driver_host="127.0.0.1",
        driver_port=driver.server_address[1],
        token="t" * 32,
        options_env={},
        run_id="liveness",
        start_timeout_s=300.0,
        heartbeat_timeout_s=heartbeat_timeout_s,
    )
