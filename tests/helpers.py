"""Helpers shared by tests: finding rank processes that outlive their run."""

from __future__ import annotations

import os
import re
import subprocess
import threading
import time
import uuid
from collections.abc import Callable
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import psutil
import pytest

RANK_ENTRY = "hvdflow.infra.launcher._rank"
# A rank calls its process hvdflow-rankN (ps, top).
RANK_NAME = re.compile(r"^hvdflow-rank(\d+)$")
# Set in this test session's environment before any Spark JVM or rank starts, so every rank it
# launches inherits it: another session's ranks on the same machine are not this one's leaks.
TEST_SESSION_VAR = "HVDFLOW_TEST_SESSION"
os.environ.setdefault(TEST_SESSION_VAR, uuid.uuid4().hex)
# Under pytest-xdist each worker is a session of its own (its own Spark, its own ranks): the id
# the workers inherit from the controller gets the worker's name.
if (_worker := os.environ.get("PYTEST_XDIST_WORKER")) and not os.environ[TEST_SESSION_VAR].endswith(
    f"-{_worker}"
):
    os.environ[TEST_SESSION_VAR] += f"-{_worker}"


def rank_processes() -> list[psutil.Process]:
    """Every live HorovodRunner rank process that this test session started."""
    session = os.environ[TEST_SESSION_VAR]
    found = []
    for proc in psutil.process_iter(["cmdline", "name"]):
        cmdline = proc.info.get("cmdline") or []
        if RANK_ENTRY not in cmdline and not RANK_NAME.match(proc.info.get("name") or ""):
            continue
        try:
            if proc.environ().get(TEST_SESSION_VAR) != session:
                continue
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
        found.append(proc)
    return found


def rank_of(proc: psutil.Process) -> int | None:
    """The rank of a rank process, from the name it gave itself; None before it did."""
    try:
        found = RANK_NAME.match(proc.name())
    except psutil.Error:
        return None
    return int(found.group(1)) if found else None


def wait_for_no_ranks(timeout_s: float = 10.0) -> list[psutil.Process]:
    """Wait until no rank process is left; return those still alive at the deadline."""
    deadline = time.monotonic() + timeout_s
    while (alive := rank_processes()) and time.monotonic() < deadline:
        time.sleep(0.2)
    return alive


@contextmanager
def worker_variable(spark, name: str, value: str):
    """``name`` set to ``value`` in the environment of the Python workers that the block's stages
    on ``spark`` start (``sc.environment``, which every Python function takes along); the value
    before, back after."""
    environment = spark.sparkContext.environment
    before = environment.get(name)
    environment[name] = value
    try:
        yield
    finally:
        if before is None:
            environment.pop(name, None)
        else:
            environment[name] = before


@contextmanager
def http_server(respond: Callable[[BaseHTTPRequestHandler], bytes | None]):
    """A GET-only HTTP server on 127.0.0.1; yields its port. ``respond(request)`` returns the
    body to send with 200, or None for a refusal (``refuse_with``, 404 by default)."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):
            body = respond(self)
            status = 200 if body is not None else getattr(respond, "refuse_with", 404)
            self.send_response(status)
            self.send_header("Content-Length", str(len(body or b"")))
            self.end_headers()
            if body:
                self.wfile.write(body)

        def log_message(self, *args):
            pass  # the tests look at what the server saw, not at its log

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()


def assert_refused_before_any_service(argv, expected: str, tmp_path, monkeypatch, capfd) -> None:
    """``hvdflow ARGV`` exits 2 with the one line ``expected`` and starts no service."""
    from hvdflow.flows.cli import main

    monkeypatch.setenv("HVDFLOW_HOME", str(tmp_path / "home"))
    assert main(argv) == 2
    assert capfd.readouterr().err.strip().splitlines() == [expected]
    assert not (tmp_path / "home" / "services.json").exists()  # no service was started


def skip_here_fail_in_ci(reason: str, what: str) -> None:
    """Skip with ``reason``; under CI=true fail instead, since ``what`` must run in CI."""
    if os.environ.get("CI") == "true":
        pytest.fail(f"{reason} (CI=true: {what} must run in CI)", pytrace=False)
    pytest.skip(reason)


def preprocessed_digits(spark, root, side: int):
    """The bundled digits preprocessed under ``root`` at ``side`` x ``side`` grayscale."""
    from hvdflow.tasks.preprocess import PreprocessConfig, preprocess_images

    return preprocess_images(
        spark,
        PreprocessConfig(
            input=str(root / "images"),
            input_format="digits",
            output=str(root / "out"),
            image_size=(side, side),
        ),
    )


def user_project(root: Path) -> Path:
    """A folder laid out as a user's own Prefect project: a ``tasks.py`` and a ``flows/`` package
    (with a ``pipeline`` module) beside their code, the names hvdflow's rooms have in the
    repository. A process started in it has it first on ``sys.path``; hvdflow must not care."""
    project = Path(root)
    (project / "flows").mkdir(parents=True, exist_ok=True)
    (project / "tasks.py").write_text("OWNER = 'the user'\n")
    (project / "flows" / "__init__.py").write_text("OWNER = 'the user'\n")
    (project / "flows" / "pipeline.py").write_text("OWNER = 'the user'\n")
    return project


def terminate(process: subprocess.Popen, grace_s: float = 20.0) -> None:
    """SIGTERM ``process``; SIGKILL it if it has not exited ``grace_s`` later."""
    process.terminate()
    try:
        process.wait(grace_s)
    except subprocess.TimeoutExpired:
        process.kill()


def fresh_prefect_events_worker() -> None:
    """Send what Prefect's events worker holds, and drop it: the next event makes a new one for
    the server the settings then name. It is one per process, keyed by client type, not by
    server: made under a test's temporary settings, it went on sending the whole pytest
    worker's events to that test's server once stopped, and later tests found their task runs
    missing. Call it on entering and on leaving such settings."""
    from prefect.events.worker import EventsWorker

    EventsWorker.drain_all(timeout=30, at_exit=False)


@contextmanager
def small_disk(path: Path, size_kib: int):
    """A real disk of ``size_kib`` KiB at ``path``: a tmpfs mount, unmounted after. A write past
    its size fails with ENOSPC, as on a full disk; ``resize_disk`` gives it room again."""
    if os.geteuid() != 0:
        skip_here_fail_in_ci(
            "a small disk is a tmpfs mount, which needs root", "the full-disk tests"
        )
    path.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size_kib}k", "tmpfs", str(path)], check=True
    )
    try:
        yield path
    finally:
        subprocess.run(["umount", "--lazy", str(path)], check=False)


def resize_disk(path: Path, size_kib: int) -> None:
    subprocess.run(["mount", "-o", f"remount,size={size_kib}k", str(path)], check=True)
