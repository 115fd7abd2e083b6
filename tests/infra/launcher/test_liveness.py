"""Liveness of the task <-> driver channel: the decisions with exact values, then both sides
over real sockets (a silent driver, a silent task) with short timeouts."""

from __future__ import annotations

import dataclasses
import os
import socket
import sys
import time

import cloudpickle
import psutil
import pytest

from hvdflow import HorovodRunner, LaunchOptions
from hvdflow.infra.launcher import _decisions, _wire
from hvdflow.infra.launcher._decisions import Tracker, is_overdue, overdue
from hvdflow.infra.launcher._driver import DriverChannel
from hvdflow.infra.launcher._task import GATHER_TIMEOUT_S, DriverLink, run_task
from hvdflow.infra.launcher.errors import RankFailed
from hvdflow.infra.launcher.options import heartbeat_timeout_error
from tests.infra.launcher.fake_driver import SilentDriver, spec_for

cloudpickle.register_pickle_by_value(sys.modules[__name__])

TIMEOUT_MESSAGE = (
    "stopped answering: the driver heard nothing from it for 15 s (HorovodRunner "
    "heartbeat_timeout_s). Its host may be unreachable or frozen; if it was only busy, raise "
    "heartbeat_timeout_s"
)


@pytest.mark.unit
def test_silence_of_exactly_the_timeout_is_not_yet_overdue():
    assert is_overdue(last_heard=100.0, now=115.0, timeout_s=15.0) is False
    assert is_overdue(last_heard=100.0, now=115.001, timeout_s=15.0) is True
    assert is_overdue(last_heard=100.0, now=101.0, timeout_s=15.0) is False


@pytest.mark.unit
def test_overdue_lists_the_silent_tasks_longest_silent_first():
    last_heard = {"task0": 90.0, "task1": 70.0, "task2": 80.0, "task3": 85.0}
    assert overdue(last_heard, now=100.0, timeout_s=15.0) == ["task1", "task2"]
    assert overdue(last_heard, now=100.0, timeout_s=30.0) == []
    assert overdue({}, now=100.0, timeout_s=1.0) == []


@pytest.mark.unit
@pytest.mark.parametrize(
    "value, error",
    [
        (6, None),
        (60.0, None),
        (
            5.9,
            "heartbeat_timeout_s=5.9: expected at least 6 seconds (3 heartbeats, one every "
            "2 s), so that one late heartbeat does not fail the run",
        ),
        (0, "heartbeat_timeout_s=0: expected at least 6 seconds"),
        (True, "heartbeat_timeout_s=True: expected at least 6 seconds"),
        ("60", "heartbeat_timeout_s='60': expected at least 6 seconds"),
        (float("nan"), "heartbeat_timeout_s=nan: expected at least 6 seconds"),
    ],
)
def test_heartbeat_timeout_must_span_several_heartbeats(value, error):
    found = heartbeat_timeout_error(value)
    if error is None:
        assert found is None
    else:
        assert found is not None and found.startswith(error)


@pytest.mark.unit
def test_a_lost_task_is_named_by_its_rank_and_host_once_the_plan_is_known():
    report = _decisions.lost_task_report(
        partition=0,
        hostname="hvd-host2",
        plan_hosts=["10.77.0.12", "10.77.0.11"],
        timeout_s=15.0,
        last_heard_at=1234.5,
    )
    # Horovod numbers ranks host by host, in the order hosts first appear: partition 0 is rank 0.
    assert report == {
        "type": "failed",
        "rank": 0,
        "reason": f"rank 0 on hvd-host2 (10.77.0.12) {TIMEOUT_MESSAGE}",
        "tail": [],
        "exited_at": 1234.5,
        "cause": "lost",
    }
    before_plan = _decisions.lost_task_report(
        partition=1, hostname="hvd-host2", plan_hosts=None, timeout_s=15.0, last_heard_at=1.0
    )
    assert before_plan["rank"] == 1
    assert before_plan["reason"] == f"the task of partition 1 on hvd-host2 {TIMEOUT_MESSAGE}"


@pytest.mark.unit
def test_the_tracker_reports_each_silent_task_once_with_when_it_was_last_heard():
    clock = {"mono": 0.0, "wall": 1000.0}
    tracker = Tracker(monotonic=lambda: clock["mono"], wall=lambda: clock["wall"])
    tracker.join("conn0", 0, "hvd-host1")
    tracker.join("conn1", 1, "hvd-host2")
    tracker.join("stranger", "1; rm -rf /", 12345)  # values off the network: kept only if sane
    tracker.plan(["10.77.0.11", "10.77.0.12"])
    clock.update(mono=10.0, wall=1010.0)
    tracker.seen("conn0")
    tracker.seen("gone")  # a connection that already left: ignored
    tracker.leave("stranger")
    clock.update(mono=15.5, wall=1015.5)
    assert tracker.lost(timeout_s=15.0) == [
        {
            "type": "failed",
            "rank": 1,
            "reason": f"rank 1 on hvd-host2 (10.77.0.12) {TIMEOUT_MESSAGE}",
            "tail": [],
            "exited_at": 1000.0,
            "cause": "lost",
        }
    ]
    assert tracker.lost(timeout_s=15.0) == []  # reported once
    clock.update(mono=25.5)
    assert [r["rank"] for r in tracker.lost(timeout_s=15.0)] == [0]


@pytest.mark.unit
def test_a_task_that_ends_without_its_bye_is_reported_lost_with_its_rank_and_host():
    tracker = Tracker(wall=lambda: 2000.0)
    tracker.join("conn0", 0, "hvd-host1")
    tracker.join("conn1", 1, "hvd-host2")
    tracker.plan(["10.77.0.11", "10.77.0.12"])
    assert tracker.leave("conn0") is None  # it said bye: it ended on its own
    assert tracker.leave("conn1", vanished=True) == {
        "type": "failed",
        "rank": 1,
        "reason": "rank 1 on hvd-host2 (10.77.0.12) was lost: its task ended without a word "
        "(its Spark executor, worker or host died with it)",
        "tail": [],
        "exited_at": 2000.0,
        "cause": "lost",  # transient: a retry may run elsewhere
    }
    assert tracker.lost(timeout_s=0.0) == []  # and never reported again as silent


@pytest.mark.unit
def test_the_tracker_keeps_only_sane_hello_values():
    clock = {"t": 0.0}
    tracker = Tracker(monotonic=lambda: clock["t"], wall=lambda: 5.0)
    tracker.join("conn", True, "h" * 1000)
    clock["t"] = 10.0
    [report] = tracker.lost(timeout_s=6.0)
    assert report["rank"] == -1
    assert report["reason"].startswith(f"a task on {'h' * 64} stopped answering")


# --- over real sockets ---


def hello(sock: socket.socket, token: str, partition: int, hostname: str) -> None:
    sock.sendall(
        _wire.encode(
            {"type": _wire.HELLO, "token": token, "partition": partition, "hostname": hostname}
        )
    )


def read_message(sock: socket.socket, within_s: float) -> dict | None:
    sock.settimeout(within_s)
    try:
        return _wire.read_message(sock.makefile("rb"))
    except TimeoutError:
        return None


@pytest.mark.integration
def test_the_driver_answers_heartbeats_and_names_a_task_that_went_silent():
    with DriverChannel("127.0.0.1", on_line=lambda line: None) as channel:
        with (
            socket.create_connection(("127.0.0.1", channel.port)) as task0,
            socket.create_connection(("127.0.0.1", channel.port)) as task1,
        ):
            hello(task0, channel.token, 0, "hvd-host1")
            hello(task1, channel.token, 1, "hvd-host2")
            task0.sendall(_wire.encode({"type": _wire.PLAN, "hosts": ["127.0.0.1", "127.0.0.2"]}))
            assert read_message(task0, 5) == {"type": _wire.PLAN_OK}
            task1.sendall(_wire.encode({"type": _wire.HEARTBEAT}))
            assert read_message(task1, 5) == {"type": _wire.HEARTBEAT}
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                task0.sendall(_wire.encode({"type": _wire.HEARTBEAT}))  # task 0 stays alive
                if lost := channel.liveness.lost(timeout_s=2.0):
                    break
                time.sleep(0.1)
            assert [r["reason"].split(" stopped")[0] for r in lost] == [
                "rank 1 on hvd-host2 (127.0.0.2)"
            ]
        # Once a task's connection ends it is no longer tracked: a finished task is not lost.
        deadline = time.monotonic() + 5
        while channel.liveness._peers and time.monotonic() < deadline:
            time.sleep(0.05)
        assert channel.liveness.lost(timeout_s=0.0) == []


@pytest.mark.integration
def test_a_task_sends_heartbeats_and_gives_up_a_silent_driver(monkeypatch):
    monkeypatch.setattr(_wire, "HEARTBEAT_INTERVAL_S", 0.1)
    driver = SilentDriver()
    try:
        link = DriverLink(spec_for(driver, b"", heartbeat_timeout_s=0.6), slot=3)
        try:
            assert not link.lost()
            time.sleep(0.9)
            assert link.lost()
        finally:
            link.close()
        assert driver.received[0] == {
            "type": _wire.HELLO,
            "token": "t" * 32,
            "partition": 3,
            "hostname": socket.gethostname(),
        }
        beats = [m for m in driver.received if m == {"type": _wire.HEARTBEAT}]
        assert len(beats) >= 4, driver.received
    finally:
        driver.shutdown()
        driver.server_close()


def sleep_long():
    print(f"pid {os.getpid()} sleeping", flush=True)
    time.sleep(600)


@pytest.mark.integration
def test_a_task_that_hears_nothing_from_the_driver_kills_its_rank(monkeypatch):
    monkeypatch.setattr(_wire, "HEARTBEAT_INTERVAL_S", 0.2)
    driver = SilentDriver()
    payload = cloudpickle.dumps((sleep_long, {}))
    try:
        started = time.monotonic()
        with pytest.raises(RankFailed) as err:
            # One task: the engine's exchange is its own, and the rank starts.
            run_task(spec_for(driver, payload, 5.0), 0, ["127.0.0.1"], all_gather=lambda m: [m])
        took = time.monotonic() - started
        message = str(err.value)
        assert message.startswith(
            f"rank 0 on {socket.gethostname()} (127.0.0.1) stopped: heard nothing from the "
            "driver for 5 s (HorovodRunner heartbeat_timeout_s); the driver, or the network to "
            "it, is gone. Last lines of its output:\n[1,0]<stdout>:pid "
        )
        assert 5.0 < took < 15.0
        rank_pid = int(message.rsplit("pid ", 1)[1].split()[0])
        assert not psutil.pid_exists(rank_pid) or (
            psutil.Process(rank_pid).status() == psutil.STATUS_ZOMBIE
        )
        failed = driver.messages(_wire.FAILED)
        assert [m["reason"] for m in failed] == [message.split(". Last lines")[0]]
    finally:
        driver.shutdown()
        driver.server_close()


@pytest.mark.integration
def test_a_task_waiting_for_the_exchange_gives_up_a_silent_driver(monkeypatch):
    """Every engine's one exchange (Horovod's rendezvous address, TF_CONFIG's endpoints) goes
    through the driver: one gone silent meanwhile ends the task after heartbeat_timeout_s, not
    after GATHER_TIMEOUT_S."""
    monkeypatch.setattr(_wire, "HEARTBEAT_INTERVAL_S", 0.2)
    driver = SilentDriver()
    try:
        started = time.monotonic()
        with pytest.raises(
            RankFailed,
            match=r"^heard nothing from the driver for 2 s before it "
            r"gathered every task's part \(heartbeat_timeout_s\)",
        ):
            spec = dataclasses.replace(spec_for(driver, b"", 2.0), engine="tf_collective")
            run_task(spec, 0, ["127.0.0.1", "127.0.0.1"])
        assert time.monotonic() - started < GATHER_TIMEOUT_S / 10
        assert len(driver.messages(_wire.GATHER)) == 1  # it did ask
    finally:
        driver.shutdown()
        driver.server_close()


def sleep_then_return(seconds):
    time.sleep(seconds)
    return "still here"


@pytest.mark.integration
def test_a_quiet_rank_outlives_the_heartbeat_timeout_because_the_heartbeats_flow():
    # 8 s without a line of output, against a 6 s heartbeat timeout on both sides.
    runner = HorovodRunner(np=-1, options=LaunchOptions(heartbeat_timeout_s=6))
    assert runner.run(sleep_then_return, seconds=8) == "still here"
