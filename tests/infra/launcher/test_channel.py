"""The driver channel: which failure is named (pure), and what it accepts from the network."""

from __future__ import annotations

import select
import socket
import threading
import time

import pytest

from hvdflow.infra.launcher import _driver, _wire
from hvdflow.infra.launcher._decisions import root_failure
from hvdflow.infra.launcher._driver import DriverChannel

SHUTDOWN = "[1,0]<stderr>:... Horovod has been shut down. This was caused by an exception"
# Rank 0's last line when rank 1 was SIGKILLed mid-allreduce (seen in CI, the path shortened).
GLOO_RESET = (
    "[1,0]<stderr>:[/tmp/pip-wheel/horovod/third_party/compatible17_gloo/gloo/transport/tcp/"
    "pair.cc:589] Read error [127.0.0.1]:41872: Connection reset by peer"
)


def report(rank, exited_at, *tail):
    return {
        "rank": rank,
        "reason": f"rank {rank} exited",
        "tail": list(tail),
        "exited_at": exited_at,
    }


@pytest.mark.unit
def test_no_failures_name_no_root():
    assert root_failure([]) == (None, [])


@pytest.mark.unit
def test_a_rank_that_saw_horovod_shut_down_loses_to_one_that_did_not_even_if_it_exited_first():
    consequence = report(0, 10.0, "epoch 1", SHUTDOWN)
    cause = report(1, 10.2, "ValueError: boom")
    assert root_failure([consequence, cause]) == (cause, [0])


@pytest.mark.unit
@pytest.mark.parametrize(
    "peer_gone",
    [
        GLOO_RESET,
        "[1,0]<stderr>:[gloo/transport/tcp/pair.cc:598] Connection closed by peer [127.0.0.1]:5",
        "[1,0]<stderr>:[gloo/transport/tcp/pair.cc:356] Write error [10.0.0.2]:7: Broken pipe",
    ],
)
def test_a_rank_whose_gloo_peer_vanished_loses_to_the_rank_that_was_killed_even_if_it_exited_first(
    peer_gone,
):
    consequence = report(0, 10.0, "epoch 2", peer_gone)
    cause = report(1, 10.2, "")  # SIGKILLed: nothing printed
    assert root_failure([consequence, cause]) == (cause, [0])


@pytest.mark.unit
@pytest.mark.parametrize(
    "peer_gone", ["Socket closed", "recvmsg:Connection reset by peer"], ids=["tf2.15", "tf2.21"]
)
def test_a_tf_worker_whose_collective_a_closed_peer_socket_aborted_loses_to_the_killed_rank(
    peer_gone,
):
    # Rank 0's last line when rank 1 was SIGKILLed in the tf_collective engine (seen in clean
    # clones, the function node shortened); rank 0 ended first, as the task of the killed rank
    # noticed its exit on a later poll.
    aborted = (
        "[1,0]<stderr>:tensorflow.python.framework.errors_impl.UnavailableError: "
        "{{function_node __wrapped__CollectiveReduceV2}} Collective ops is aborted by: " + peer_gone
    )
    consequence = report(0, 10.0, "Epoch 1/50", aborted)
    cause = report(1, 10.2, "worker 1 about to get SIGKILL")
    assert root_failure([consequence, cause]) == (cause, [0])
    # Aborted for a reason of its own (here, the coordination service's verdict on rank 1):
    # still a cause, the earliest exit first.
    unhealthy = aborted.replace(peer_gone, "The following tasks are unhealthy")
    assert root_failure([report(0, 10.0, unhealthy), cause])[0]["rank"] == 0


@pytest.mark.unit
def test_a_connection_reset_outside_gloo_is_a_cause_of_its_own():
    own = report(0, 10.0, "ConnectionResetError: [Errno 104] Connection reset by peer")
    assert root_failure([own, report(1, 10.2, "boom")]) == (own, [1])


@pytest.mark.unit
def test_among_causes_the_earliest_exit_is_the_root():
    first, second = report(2, 5.0, "boom"), report(1, 5.5, "bang")
    assert root_failure([second, first]) == (first, [1])


@pytest.mark.unit
def test_among_consequences_only_the_earliest_exit_is_the_root():
    late, early = report(1, 3.0, SHUTDOWN), report(3, 2.0, SHUTDOWN)
    assert root_failure([late, early]) == (early, [1])


@pytest.mark.unit
def test_the_others_are_sorted_unique_and_exclude_the_root():
    failures = [
        report(3, 9.0, SHUTDOWN),
        report(0, 8.0, SHUTDOWN),
        report(2, 7.0),  # no output at all: still a cause
        report(2, 9.5, "stopped: the driver cancelled the run"),  # the root, reported twice
        report(0, 9.9, SHUTDOWN),
    ]
    assert root_failure(failures) == (failures[2], [0, 3])


@pytest.mark.unit
def test_a_report_without_tail_or_exit_time_counts_as_a_cause_that_exited_at_zero():
    bare = {"rank": 4, "reason": "rank 4 exited"}
    assert root_failure([report(1, 1.0, "boom"), bare]) == (bare, [1])


@pytest.mark.integration
def test_the_channel_names_the_root_of_the_reports_it_received():
    with DriverChannel("127.0.0.1", on_line=lambda line: None) as channel:
        channel.failures.extend([report(0, 10.0, SHUTDOWN), report(1, 10.2, "boom")])
        root, others = channel.root_failure()
    assert root["rank"] == 1 and others == [0]


@pytest.mark.integration
def test_a_lost_task_read_after_its_peers_report_is_still_named_as_the_cause():
    """What CI saw once Spark ended the job on its own: a host's executor lost, the job ended,
    a surviving rank's "Horovod has been shut down" reported, and the lost task's connection
    end read a moment later. The failures are gathered until no connection is open, so the
    lost task is named, not the rank that only noticed; and no later than that."""
    with DriverChannel("127.0.0.1", on_line=lambda line: None) as channel:
        survivor, lost = _task(channel, 0), _task(channel, 1)
        for task in (survivor, lost):  # the driver answers a heartbeat once it read the hello
            task.sendall(_wire.encode({"type": _wire.HEARTBEAT}))
            assert _wire.read_message(task.makefile("rb")) == {"type": _wire.HEARTBEAT}
        failed = {
            "type": _wire.FAILED,
            "rank": 0,
            "reason": "rank 0 exited with code 1",
            "tail": [SHUTDOWN],
            "exited_at": time.time(),
        }
        survivor.sendall(_wire.encode(failed) + _wire.encode({"type": _wire.BYE}))
        survivor.close()
        assert channel.failed.wait(5)
        threading.Timer(0.5, lost.close).start()  # no bye: its process died
        started = time.monotonic()
        channel.gather_failures(expected=3, within_s=60)  # the third task never connected
        waited_s = time.monotonic() - started
        root, others = channel.root_failure()
    assert root["rank"] == 1 and "was lost" in root["reason"] and others == [0]
    assert 0.4 < waited_s < 30, waited_s  # until the last connection ended, not the deadline


@pytest.mark.integration
def test_the_driver_listens_only_on_the_executor_facing_address():
    with DriverChannel("127.0.0.1", on_line=lambda line: None) as channel:
        assert channel._server.server_address[0] == "127.0.0.1"


def closed_by_peer(sock: socket.socket, within_s: float) -> bool:
    """Whether the other side closes ``sock`` within ``within_s`` seconds."""
    sock.settimeout(within_s)
    try:
        while sock.recv(4096):
            pass
        return True
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False


@pytest.mark.integration
def test_a_connection_that_says_nothing_is_closed_after_the_hello_timeout(monkeypatch, caplog):
    monkeypatch.setattr(_driver, "HELLO_TIMEOUT_S", 0.5)
    with DriverChannel("127.0.0.1", on_line=lambda line: None) as channel:
        with socket.create_connection(("127.0.0.1", channel.port)) as stranger:
            started = time.monotonic()
            assert closed_by_peer(stranger, within_s=5)
            assert time.monotonic() - started < 3
    assert "sent no hello within 0.5 s (HELLO_TIMEOUT_S)" in caplog.text


@pytest.mark.integration
def test_a_wrong_token_is_closed_and_its_lines_ignored(caplog):
    lines = []
    with DriverChannel("127.0.0.1", on_line=lines.append) as channel:
        with socket.create_connection(("127.0.0.1", channel.port)) as stranger:
            stranger.sendall(_wire.encode({"type": _wire.HELLO, "token": "0" * 32}))
            stranger.sendall(line_message("forged"))
            assert closed_by_peer(stranger, within_s=5)
    assert lines == []
    assert "wrong token" in caplog.text and channel.token not in caplog.text


@pytest.mark.integration
def test_a_task_that_connects_after_the_run_failed_is_refused(caplog):
    # What Spark re-running a failed barrier stage looks like to the driver: new tasks of the
    # same run, with its token, after a rank failed. Only the caller's retry may train again.
    lines = []
    with DriverChannel("127.0.0.1", on_line=lines.append) as channel:
        channel.report({"type": _wire.FAILED, "rank": 1, "reason": "killed", "tail": []})
        with socket.create_connection(("127.0.0.1", channel.port)) as task:
            hello = {"type": _wire.HELLO, "token": channel.token, "partition": 0}
            task.sendall(_wire.encode(hello))
            task.sendall(line_message("from a re-run stage"))
            assert closed_by_peer(task, within_s=5)
    assert lines == []
    assert "refused a task of partition 0: this run has already failed" in caplog.text


def line_message(text: str, rank: int = 0) -> bytes:
    return _wire.encode(
        {"type": _wire.LINE, "time": 1.0, "rank": rank, "stream": _wire.STDOUT, "text": text}
    )


@pytest.mark.integration
def test_a_task_silent_for_longer_than_the_hello_timeout_stays_connected(monkeypatch):
    monkeypatch.setattr(_driver, "HELLO_TIMEOUT_S", 0.3)
    arrived = threading.Event()
    lines = []

    def on_line(line):
        lines.append(line)
        arrived.set()

    with DriverChannel("127.0.0.1", on_line=on_line) as channel:
        with socket.create_connection(("127.0.0.1", channel.port)) as task:
            task.sendall(_wire.encode({"type": _wire.HELLO, "token": channel.token}))
            assert not closed_by_peer(task, within_s=1.0)  # a rank busy with no output
            task.sendall(line_message("after a quiet second"))
            assert arrived.wait(5)
    assert lines == [_wire.LogLine(1.0, 0, _wire.STDOUT, "after a quiet second")]


@pytest.mark.integration
def test_a_message_over_the_cap_closes_that_connection_only(caplog):
    lines = []
    with DriverChannel("127.0.0.1", on_line=lines.append) as channel:
        with (
            socket.create_connection(("127.0.0.1", channel.port)) as bad,
            socket.create_connection(("127.0.0.1", channel.port)) as good,
        ):
            for task in (bad, good):
                task.sendall(_wire.encode({"type": _wire.HELLO, "token": channel.token}))

            def flood():
                try:
                    bad.sendall(line_message("x" * (_wire.MAX_MESSAGE_BYTES + 1)))
                except OSError:
                    pass

            flooder = threading.Thread(target=flood)
            flooder.start()
            assert closed_by_peer(bad, within_s=10)
            flooder.join(10)
            good.sendall(line_message("still here", rank=1))
            deadline = time.monotonic() + 5
            while not lines and time.monotonic() < deadline:
                time.sleep(0.05)
    assert [line.text for line in lines] == ["still here"]
    assert "longer than 4194304 bytes (MAX_MESSAGE_BYTES)" in caplog.text


@pytest.mark.integration
def test_a_consumer_that_raises_system_exit_does_not_end_the_tasks_connection(caplog):
    """Rich raises SystemExit on a broken pipe (Prefect's console handler, its worker dead):
    it ended the connection's thread, and the driver took the task for lost."""
    lines = []

    def on_line(line):
        lines.append(line)
        if len(lines) == 1:
            raise SystemExit(1)

    with DriverChannel("127.0.0.1", on_line=on_line) as channel:
        with socket.create_connection(("127.0.0.1", channel.port)) as task:
            task.sendall(_wire.encode({"type": _wire.HELLO, "token": channel.token}))
            task.sendall(line_message("met a dead pipe"))
            task.sendall(line_message("and went on"))
            deadline = time.monotonic() + 5
            while len(lines) < 2 and time.monotonic() < deadline:
                time.sleep(0.05)
            assert not closed_by_peer(task, within_s=0.5)
    assert [line.text for line in lines] == ["met a dead pipe", "and went on"]
    assert "a rank output consumer failed" in caplog.text


@pytest.mark.integration
def test_a_message_the_driver_cannot_handle_is_named_as_the_drivers_failure_not_a_lost_task(
    caplog,
):
    """A line without its time raises in the driver's reading thread. Its task was reported
    as "lost: its task ended without a word", which sends a user to the executors' logs."""
    with DriverChannel("127.0.0.1", on_line=lambda line: None) as channel:
        with socket.create_connection(("127.0.0.1", channel.port)) as task:
            task.sendall(
                _wire.encode(
                    {
                        "type": _wire.HELLO,
                        "token": channel.token,
                        "partition": 1,
                        "hostname": "h1",
                    }
                )
            )
            task.sendall(
                _wire.encode({"type": _wire.LINE, "rank": 1, "stream": _wire.STDOUT, "text": "x"})
            )
            assert channel.failed.wait(5)
    ((failure), others) = channel.root_failure()
    assert others == []
    assert failure["cause"] == _wire.CAUSE_DRIVER and _wire.CAUSE_DRIVER in _wire.TRANSIENT_CAUSES
    assert failure["reason"] == (
        "the driver stopped reading the messages of the task of partition 1 on h1 when handling "
        "one raised KeyError: 'time' (the traceback is in the driver's log; the task itself did "
        "not fail)"
    )
    assert "the driver stopped reading rank slot 1" in caplog.text


def _task(channel: DriverChannel, partition: int) -> socket.socket:
    """A task's connection to ``channel`` that has said hello as ``partition``."""
    sock = socket.create_connection(("127.0.0.1", channel.port))
    sock.sendall(
        _wire.encode(
            {
                "type": _wire.HELLO,
                "token": channel.token,
                "partition": partition,
                "hostname": f"h{partition}",
            }
        )
    )
    sock.settimeout(5)
    return sock


def _silent(sock: socket.socket, for_s: float) -> bool:
    """Whether the driver sends this task nothing for ``for_s`` (it answers no heartbeat here:
    the tasks send none)."""
    readable, _, _ = select.select([sock], [], [], for_s)
    return not readable


def _next(sock: socket.socket, reader) -> dict:
    """The next message other than a heartbeat."""
    while (message := _wire.read_message(reader)) is not None:
        if message.get("type") != _wire.HEARTBEAT:
            return message
    raise AssertionError(f"{sock.getpeername()} closed")


@pytest.mark.integration
def test_every_task_sends_the_plan_and_only_the_first_is_the_runs(monkeypatch):
    """Each task waits for its own answer instead of a Spark barrier, so each sends the plan;
    liveness learns the run's hosts once, before any answer. A plan unlike the first is not
    answered."""
    with DriverChannel("127.0.0.1", on_line=lambda line: None) as channel:
        started = []
        monkeypatch.setattr(channel.liveness, "plan", started.append)
        hosts = ["127.0.0.1", "127.0.0.1"]
        tasks = [_task(channel, partition) for partition in (0, 1, 2)]
        readers = [task.makefile("rb") for task in tasks]
        try:
            for task, reader in zip(tasks[:2], readers, strict=False):
                task.sendall(_wire.encode({"type": _wire.PLAN, "hosts": hosts}))
                assert _next(task, reader) == {"type": _wire.PLAN_OK}
            assert len(started) == 1
            tasks[2].sendall(_wire.encode({"type": _wire.PLAN, "hosts": ["10.0.0.9"]}))
            assert _silent(tasks[2], 1.0)
        finally:
            for task in tasks:
                task.close()


@pytest.mark.integration
def test_the_exchange_answers_every_task_with_every_part_in_partition_order_once_all_came():
    """The engines' one exchange among the tasks, made by the driver (Spark's allGather looks
    once a second): nothing is answered before the last part, then each task gets them all."""
    with DriverChannel("127.0.0.1", on_line=lambda line: None) as channel:
        tasks = [_task(channel, partition) for partition in (0, 1, 2)]
        readers = [task.makefile("rb") for task in tasks]
        try:
            for partition in (2, 0):  # out of order, and the third part still missing
                tasks[partition].sendall(
                    _wire.encode(
                        {
                            "type": _wire.GATHER,
                            "partition": partition,
                            "tasks": 3,
                            "part": f"p{partition}",
                        }
                    )
                )
            assert _silent(tasks[0], 0.5) and _silent(tasks[2], 0.0)
            tasks[1].sendall(
                _wire.encode({"type": _wire.GATHER, "partition": 1, "tasks": 3, "part": "p1"})
            )
            for task, reader in zip(tasks, readers, strict=True):
                assert _next(task, reader) == {
                    "type": _wire.GATHERED,
                    "parts": ["p0", "p1", "p2"],
                }
        finally:
            for task in tasks:
                task.close()
