"""The embedded Prefect server, started and stopped for real."""

from __future__ import annotations

import base64
import os
import time
import urllib.request

import psutil
import pytest
import requests

from hvdflow.infra.services.prefect_server import PrefectServer
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


def _basic(auth_string: str) -> dict[str, str]:
    """The header Prefect's client sends for PREFECT_API_AUTH_STRING."""
    return {"Authorization": "Basic " + base64.b64encode(auth_string.encode()).decode()}


def test_with_auth_the_api_requires_the_auth_string_and_a_client_with_it_works(tmp_path):
    from prefect.client.orchestration import get_client
    from prefect.exceptions import PrefectHTTPStatusError
    from prefect.settings import PREFECT_API_AUTH_STRING, PREFECT_API_URL, temporary_settings

    with PrefectServer(tmp_path / "prefect", auth=True) as server:
        auth_string = server.env()["PREFECT_API_AUTH_STRING"]
        flows = f"{server.api_url}/flows/filter"
        assert requests.post(flows, json={}, timeout=10).status_code == 401
        wrong = _basic("admin:not-the-password")
        assert requests.post(flows, json={}, headers=wrong, timeout=10).status_code == 401
        assert requests.post(flows, json={}, headers=_basic(auth_string), timeout=10).json() == []
        # The health check stays open, for probes.
        assert requests.get(f"{server.api_url}/health", timeout=10).status_code == 200

        with temporary_settings(
            {PREFECT_API_URL: server.api_url, PREFECT_API_AUTH_STRING: auth_string}
        ):
            with get_client(sync_client=True) as client:
                client.create_flow_from_name("hvdflow-auth-check")
                assert [flow.name for flow in client.read_flows()] == ["hvdflow-auth-check"]
        with temporary_settings(
            {PREFECT_API_URL: server.api_url, PREFECT_API_AUTH_STRING: "admin:not-the-password"}
        ):
            with (
                get_client(sync_client=True) as client,
                pytest.raises(PrefectHTTPStatusError) as err,
            ):
                client.read_flows()
        assert err.value.response.status_code == 401
        assert auth_string.split(":")[1] not in str(err.value)


# Holds a slot of limit "cluster" at argv[1] until argv[2] exists, then releases it and prints
# the slots still taken. A process of its own: Prefect's clients and events worker in the
# pytest process stay pointed at the session's server.
HOLD_A_SLOT = """
import os, sys, time
from prefect.client.orchestration import get_client
from prefect.client.schemas.actions import GlobalConcurrencyLimitCreate
from prefect.concurrency.sync import concurrency

with get_client(sync_client=True) as client:
    client.create_global_concurrency_limit(GlobalConcurrencyLimitCreate(name="cluster", limit=1))
with concurrency("cluster", occupy=1, lease_duration=60):
    print("HELD", flush=True)
    while not os.path.exists(sys.argv[2]):
        time.sleep(0.2)
with get_client(sync_client=True) as client:
    print("TAKEN", client.read_global_concurrency_limit_by_name("cluster").active_slots)
"""


def test_concurrency_slots_held_across_a_server_restart_are_given_back(tmp_path):
    """Prefect keeps the leases of concurrency slots in memory by default: a restart under a
    flow that holds ``spark-slots`` lost its lease, the release found none, and the slots stayed
    taken for good (every later training waited forever; found by the soak)."""
    import subprocess
    import sys

    home, go_on = tmp_path / "prefect", tmp_path / "go-on"
    server = PrefectServer(home).start()
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD_A_SLOT, server.api_url, str(go_on)],
        env={**os.environ, "PREFECT_API_URL": server.api_url},
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "HELD"
        server.process.kill()  # a crash, not a stop
        server.process.wait(10)
        server = PrefectServer(home, port=server.port).start()
        go_on.touch()
        out, _ = holder.communicate(timeout=120)
        assert holder.returncode == 0 and out.split() == ["TAKEN", "0"], out
    finally:
        holder.kill()
        server.stop()
