"""Two MultiWorkerMirroredStrategy workers on this machine for a study: free ports, the
study's module started twice with ``--worker I --ports P0,P1``, one core each."""

from __future__ import annotations

import os
import socket
import subprocess
import sys


def start_two_workers(module: str, argv: list[str]) -> int:
    """Runs ``python -m module *argv --worker i --ports ...`` for i in 0, 1; the worse exit."""
    sockets = [socket.socket() for _ in range(2)]
    for s in sockets:
        s.bind(("127.0.0.1", 0))
    ports = ",".join(str(s.getsockname()[1]) for s in sockets)
    for s in sockets:
        s.close()
    env = os.environ | {"OMP_NUM_THREADS": "1", "TF_CPP_MIN_LOG_LEVEL": "3"}
    base = [sys.executable, "-m", module, *argv]
    workers = [
        subprocess.Popen([*base, "--worker", str(i), "--ports", ports], env=env) for i in range(2)
    ]
    return max(w.wait() for w in workers)
