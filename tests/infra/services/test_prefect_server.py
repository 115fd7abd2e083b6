"""The embedded Prefect server, started and stopped for real."""

from __future__ import annotations

import os
import time
import urllib.request

import psutil
import pytest

from infra.services.prefect_server import PrefectServer
from tests.infra.services.helpers import running_in_group

pytestmark = pytest.mark.integration


def test_the_prefect_server_answers_and_leaves_no_process_once_stopped(tmp_path):
    started = time.monotonic()
    with PrefectServer(tmp_path / "prefect") as server:
        took = time.monotonic() - started
        with urllib.request.urlopen(f"{server.api_url}/health", timeout=5) as response:
            assert (response.status, response.read()) == (200, b"true")
        with urllib.request.urlopen(server.url, timeout=5) as response:
            assert response.status == 200  # the UI
        assert (tmp_path / "prefect" / "prefect.db").exists()  # PREFECT_HOME was its home
        processes = [psutil.Process(server.pid), *psutil.Process(server.pid).children(True)]
        pgid = os.getpgid(server.pid)
    assert pgid == server.pid
    assert running_in_group(pgid) == []
    assert [p.pid for p in processes if p.is_running() and p.status() != "zombie"] == []
    assert server.process.returncode is not None
    assert took < PrefectServer.START_TIMEOUT_S
