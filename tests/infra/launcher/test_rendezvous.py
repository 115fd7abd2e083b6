"""The Gloo rendezvous store answers only the run's ranks: the decision, the server rank 0's
task starts, the address every task learns, a run."""

from __future__ import annotations

import contextlib
import http.client
import logging
import shutil
import subprocess
import threading
import time
from dataclasses import replace

import pytest

# The Gloo rendezvous server is Horovod's: the classic profile's (hvdflow[horovod]).
pytest.importorskip("horovod", reason="the horovod engine is not installed (current profile)")

from hvdflow.infra import constants as c  # noqa: E402
from hvdflow.infra.launcher import _engines, _rendezvous  # noqa: E402
from hvdflow.infra.launcher._driver import DriverChannel  # noqa: E402
from hvdflow.infra.launcher._rendezvous import (  # noqa: E402
    ACCEPT,
    LONG_POLL_S,
    NOT_PLANNED_HINT,
    Decision,
    TaskRendezvous,
    allowed_clients,
    decide,
    normalize_address,
)
from hvdflow.infra.launcher.runner import HorovodRunner  # noqa: E402
from hvdflow.training.smoke import train_digits  # noqa: E402
from tests.helpers import skip_here_fail_in_ci, wait_for_no_ranks  # noqa: E402

PLANNED = frozenset({"10.0.0.1", "10.0.0.2"})
SIZES = {"global": 2, "local_10.0.0.1": 1, "local_10.0.0.2": 1, "cross_0": 2}
# A source address on this machine that is not the ranks' (all of 127/8 is loopback on Linux).
STRANGER = "127.0.0.2"
NOT_PLANNED = Decision(
    403, "10.0.0.3 is not a task host of this run's plan", False, NOT_PLANNED_HINT
)


# --- the decision, as a pure function ---


@pytest.mark.unit
def test_allowed_clients_are_the_plans_hosts_and_no_other():
    addresses = {"worker-a": ["10.0.0.1", "fe80::1"], "10.0.0.2": ["::ffff:10.0.0.2"]}
    allowed = allowed_clients(["worker-a", "10.0.0.2", "worker-a"], addresses.get)
    assert allowed == frozenset({"10.0.0.1", "fe80::1", "10.0.0.2"})


@pytest.mark.unit
def test_a_host_that_does_not_resolve_adds_no_address():
    assert allowed_clients(["gone", "127.0.0.1"], {"gone": [], "127.0.0.1": ["127.0.0.1"]}.get) == {
        "127.0.0.1"
    }


@pytest.mark.unit
def test_addresses_are_compared_in_one_form():
    assert normalize_address("::ffff:127.0.0.1") == "127.0.0.1"
    assert normalize_address("FE80::1%eth0") == "fe80::1"
    assert normalize_address("not-an-ip") == "not-an-ip"


@pytest.mark.unit
@pytest.mark.parametrize(
    ("method", "path", "client", "expected"),
    [
        ("GET", "/global/1", "10.0.0.1", ACCEPT),
        ("PUT", "/global/0", "::ffff:10.0.0.2", ACCEPT),
        ("DELETE", "/global/1", "10.0.0.2", ACCEPT),
        # Process sets use scopes outside the plan: still allowed, for the plan's hosts.
        ("PUT", "/global_ps1/0", "10.0.0.1", ACCEPT),
        ("DELETE", "/global_ps1/3", "10.0.0.1", ACCEPT),
        ("PUT", "/global/0", "10.0.0.3", NOT_PLANNED),
        ("GET", "/global/0", "10.0.0.3", NOT_PLANNED),
        ("DELETE", "/global/0", "10.0.0.3", NOT_PLANNED),
        # A stranger learns nothing else, not even which methods exist.
        ("HEAD", "/", "10.0.0.3", NOT_PLANNED),
        ("HEAD", "/", "10.0.0.1", Decision(405, "HEAD is not a rendezvous request", False)),
        ("GET", "/global", "10.0.0.1", Decision(400, "expected a path /<scope>/<key>", False)),
        ("GET", "/a/b/c", "10.0.0.1", Decision(400, "expected a path /<scope>/<key>", False)),
        ("GET", "//0", "10.0.0.1", Decision(400, "expected a path /<scope>/<key>", False)),
        (
            "DELETE",
            "/global/2",
            "10.0.0.1",
            Decision(400, "global/2: a DELETE names a rank of the scope (0-1)", False),
        ),
        (
            "DELETE",
            "/cross_9/x",
            "10.0.0.1",
            Decision(400, "cross_9/x: a DELETE names a rank of the scope (a rank number)", False),
        ),
    ],
)
def test_who_may_do_what(method, path, client, expected):
    assert decide(method, path, client, PLANNED, scope_sizes=SIZES) == expected


@pytest.mark.unit
def test_before_the_plan_nobody_is_answered():
    assert decide("GET", "/global/0", "127.0.0.1", frozenset()) == Decision(
        403, "127.0.0.1 asked before the run's plan was known", False
    )


@pytest.mark.unit
def test_keys_are_write_once_but_a_retried_put_of_the_same_bytes_succeeds():
    def put(stored, body):
        return decide("PUT", "/global/0", "10.0.0.1", PLANNED, stored=stored, body=body)

    assert put(None, b"rank 0 at 10.0.0.1:5000") == ACCEPT
    assert put(b"rank 0 at 10.0.0.1:5000", b"rank 0 at 10.0.0.1:5000") == ACCEPT
    assert put(b"rank 0 at 10.0.0.1:5000", b"evil at 10.6.6.6:1") == Decision(
        409, "global/0 already holds another value: rendezvous keys are write-once", False
    )
    assert put(b"rank 0 at 10.0.0.1:5000", None) == ACCEPT  # the body is not read yet


@pytest.mark.unit
def test_a_rank_finishes_a_scope_once():
    counted = frozenset({("global", "1")})
    assert decide(
        "DELETE", "/global/1", "10.0.0.1", PLANNED, scope_sizes=SIZES, counted=counted
    ) == Decision(200, "rank 1 already finished global", False)
    assert (
        decide("DELETE", "/global/0", "10.0.0.1", PLANNED, scope_sizes=SIZES, counted=counted)
        == ACCEPT
    )


# --- the server ---


def request(port, method, path, body=None, source=None):
    """(status, body) of one HTTP request to the rendezvous server, from ``source``."""
    conn = http.client.HTTPConnection(
        "127.0.0.1", port, timeout=5, source_address=(source, 0) if source else None
    )
    try:
        conn.request(method, path, body=body)
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


@contextlib.contextmanager
def rendezvous(hosts: list[str]):
    """The server rank 0's task starts for ranks on ``hosts``; its port."""
    server = TaskRendezvous("127.0.0.1", hosts, _engines.host_alloc_plan(hosts))
    try:
        yield server.port
    finally:
        server.close()


@pytest.mark.integration
def test_the_tasks_learn_rank_0s_rendezvous_through_their_one_exchange():
    """Partition 0 (rank 0) starts the server and offers its address; the other task offers
    nothing and gets it: every rank's environment names rank 0's host, nothing the driver's."""
    hosts = ["127.0.0.1", "127.0.0.1"]
    plan = _engines.plan_ranks(hosts)
    offered: list[str] = []

    def ranks_of(partition: int) -> list:
        return [(plan[partition], f"rank {partition}", {}, None)]

    def exchange(part: str) -> list[str]:
        offered.append(part)
        return [offered[0], ""]

    first, second = ranks_of(0), ranks_of(1)
    place = _engines.TaskPlace(0, 2, "run", tuple(hosts))
    (held,) = _engines._serve_rendezvous(first, exchange, place)
    try:
        assert _engines._serve_rendezvous(second, exchange, replace(place, partition=1)) == []
        assert offered == [f"127.0.0.1:{held.port}", ""]
        for _slot, _who, env, _link in (*first, *second):
            assert env[c.HOROVOD_GLOO_RENDEZVOUS_ADDR] == "127.0.0.1"
            assert env[c.HOROVOD_GLOO_RENDEZVOUS_PORT] == str(held.port)
        assert request(held.port, "PUT", "/global/0", b"rank0") == (200, b"")
    finally:
        held.close()
    with pytest.raises(OSError):
        request(held.port, "GET", "/global/0")  # closed with the ranks' end


@pytest.mark.integration
def test_the_server_answers_only_the_plans_hosts_and_keeps_keys_write_once(caplog):
    with rendezvous(["127.0.0.1", "127.0.0.1"]) as port:
        assert request(port, "PUT", "/global/0", b"rank0") == (200, b"")
        assert request(port, "PUT", "/global/0", b"evil") == (409, b"")
        assert request(port, "PUT", "/global/0", b"rank0") == (200, b"")  # a retry
        assert request(port, "GET", "/global/0") == (200, b"rank0")
        assert request(port, "GET", "/global/1") == (404, b"")
        assert request(port, "HEAD", "/") == (405, b"")

        for method, body in (("GET", None), ("PUT", b"evil"), ("DELETE", None)):
            assert request(port, method, "/global/0", body, source=STRANGER) == (403, b"")
        assert request(port, "GET", "/global/0") == (200, b"rank0")

        # Rank 0 finishing twice does not finish the scope for rank 1.
        assert request(port, "DELETE", "/global/0") == (200, b"")
        assert request(port, "DELETE", "/global/0") == (200, b"")
        assert request(port, "GET", "/global/0") == (200, b"rank0")
        assert request(port, "DELETE", "/global/5") == (400, b"")
        assert request(port, "DELETE", "/global/1") == (200, b"")
        assert request(port, "GET", "/global/0") == (404, b"")  # both done: cleared
    refused = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    prefix = "rendezvous server refused "
    assert refused == [
        f"{prefix}PUT '/global/0' from 127.0.0.1 (HTTP 409): global/0 already holds another "
        "value: rendezvous keys are write-once",
        f"{prefix}HEAD '/' from 127.0.0.1 (HTTP 405): HEAD is not a rendezvous request",
        # One warning per client and status: the stranger's PUT and DELETE go to debug.
        f"{prefix}GET '/global/0' from 127.0.0.2 (HTTP 403): 127.0.0.2 is not a task host of "
        f"this run's plan. {NOT_PLANNED_HINT}",
        f"{prefix}DELETE '/global/5' from 127.0.0.1 (HTTP 400): global/5: a DELETE names a rank "
        "of the scope (0-1)",
    ]


@pytest.mark.integration
def test_a_put_over_the_size_cap_is_refused_without_reading_it():
    with rendezvous(["127.0.0.1"]) as port:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
        conn.putrequest("PUT", "/global/0")
        conn.putheader("Content-Length", str(2**31))
        conn.endheaders()
        assert conn.getresponse().status == 413
        conn.close()


@pytest.mark.integration
def test_a_get_for_a_key_not_written_yet_is_answered_by_its_put_not_by_polling():
    """Gloo's store polls a missing key every 10 ms; held instead, a waiting rank costs one
    request and hears of the key the moment it is written."""
    with rendezvous(["127.0.0.1", "127.0.0.1"]) as port:
        answered: list = []
        waiting = threading.Thread(
            target=lambda: answered.append((request(port, "GET", "/global/1"), time.time()))
        )
        waiting.start()
        time.sleep(LONG_POLL_S / 4)
        assert request(port, "PUT", "/global/1", b"rank1") == (200, b"")
        written = time.time()
        waiting.join(5)
        (((status, body), at),) = answered
        assert (status, body) == (200, b"rank1")
        assert at - written < LONG_POLL_S / 2  # woken by the PUT, not by the hold's end

        started = time.monotonic()
        assert request(port, "GET", "/global/0") == (404, b"")  # never written: 404 after
        assert time.monotonic() - started >= LONG_POLL_S * 0.9  # the hold, once


@pytest.mark.integration
def test_the_driver_queues_as_many_connections_as_the_kernel_allows():
    """np ranks connect at once, and each Gloo request is a connection of its own: a backlog of
    5 (socketserver's default) drops the later SYNs, which TCP resends only after 1 s."""
    if shutil.which("ss") is None:
        skip_here_fail_in_ci("needs `ss` (iproute2: scripts/test-tools.sh)", "this test")
    with (
        DriverChannel("127.0.0.1", on_line=lambda line: None) as channel,
        rendezvous(["127.0.0.1"]) as rendezvous_port,
    ):
        for port in (channel.port, rendezvous_port):
            listening = subprocess.run(
                ["ss", "-ltnH", f"sport = :{port}"], capture_output=True, text=True, check=True
            ).stdout.split()
            # A listening socket's Send-Q is its backlog.
            assert int(listening[2]) >= 128, listening


# --- a real run with a stranger writing the rendezvous keys all along ---


@pytest.mark.slow
def test_a_stranger_writing_rendezvous_keys_all_run_long_cannot_change_the_ranks_peers(
    monkeypatch, caplog
):
    channels: list[TaskRendezvous] = []

    class Recorded(TaskRendezvous):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            channels.append(self)

    monkeypatch.setattr(_rendezvous, "TaskRendezvous", Recorded)
    answers: list[int] = []
    stop = threading.Event()
    paths = [
        f"/{scope}/{key}"
        for scope in ("global", "local_127.0.0.1", "cross_0", "cross_1")
        for key in ("0", "1")
    ]

    def stranger():
        while not channels and not stop.is_set():
            time.sleep(0.005)
        while not stop.is_set():
            for path in paths:
                for method, body in (
                    ("PUT", b"\x02\x00\x1f\x90\x0a\x06\x06\x06"),
                    ("DELETE", None),
                ):
                    try:
                        status, _ = request(channels[0].port, method, path, body, source=STRANGER)
                    except OSError:  # the run ended and its server with it
                        return
                    answers.append(status)
            # Every key about twenty times a second, within any rendezvous: fewer requests than
            # a 10 ms pause made, each one CPU for the stranger and the server it hammers.
            time.sleep(0.05)

    thread = threading.Thread(target=stranger, daemon=True)
    thread.start()
    try:
        result = HorovodRunner(np=-2).run(train_digits, epochs=1)
    finally:
        stop.set()
        thread.join(10)

    assert result["size"] == 2 and len(result["checksums"]) == 2
    assert len(set(result["checksums"])) == 1, result["checksums"]
    assert len(answers) > 100  # it kept at it during the whole rendezvous
    assert set(answers) == {403}
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert sum("rendezvous server refused" in m and STRANGER in m for m in warnings) == 1
    assert wait_for_no_ranks() == []
