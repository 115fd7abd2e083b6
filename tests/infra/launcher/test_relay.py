"""The task <-> driver channel through the object store (``_relay``), for executors that cannot
reach the driver: on a real SeaweedFS server, with real Spark tasks."""

from __future__ import annotations

import logging
import sys

import cloudpickle
import pytest

from hvdflow import HorovodRunner, LaunchOptions, RankFailed
from hvdflow.infra.launcher import _relay
from hvdflow.infra.launcher._driver import DriverChannel, pickle_payload
from hvdflow.infra.launcher._task import TaskSpec, run_task
from tests.helpers import wait_for_no_ranks

cloudpickle.register_pickle_by_value(sys.modules[__name__])


@pytest.fixture
def relay_store(store, monkeypatch):
    """The test's own bucket and prefix, as the relay finds them: from the environment."""
    monkeypatch.setenv("HVDFLOW_BUCKET", store.config.bucket)
    monkeypatch.setenv("HVDFLOW_PREFIX", store.config.prefix)
    return store


def relay_keys(store) -> list[str]:
    return store.list_keys(store.config.key("relay") + "/")


def say_and_return(tag: str) -> str:
    import os

    rank = int(os.environ["HOROVOD_RANK"])
    print(f"rank {rank} says {tag}", flush=True)
    return f"{tag} from rank {rank}"


def fail_on_rank_1() -> None:
    import os

    if os.environ["HOROVOD_RANK"] == "1":
        print("rank 1 gives up", flush=True)
        raise RuntimeError("no data for rank 1")


@pytest.mark.unit
def test_the_relay_setting_is_checked_when_the_options_are_made():
    with pytest.raises(ValueError, match=r"relay='sometimes': expected one of auto, always, never"):
        LaunchOptions(relay="sometimes")
    # Fine with Horovod: its rendezvous is on rank 0's task, not on the driver.
    assert LaunchOptions(relay="always").engine == "horovod"


@pytest.mark.integration
def test_ranks_that_reach_the_driver_only_through_the_object_store(spark, relay_store, caplog):
    options = LaunchOptions(spark=spark, engine="tf_collective", relay="always")
    runner = HorovodRunner(np=2, options=options)
    with caplog.at_level(logging.INFO, logger="hvdflow.infra.launcher._driver"):
        assert runner.run(say_and_return, tag="hello") == "hello from rank 0"
    log = open(runner.log_path).read()
    assert "[1,0]<stdout>:rank 0 says hello" in log
    assert "[1,1]<stdout>:rank 1 says hello" in log
    said = [record.getMessage() for record in caplog.records]
    relayed = [message for message in said if "through the object store" in message]
    assert len(relayed) == 2, relayed
    assert "relay='always'" in relayed[0]
    assert relay_keys(relay_store) == []  # every mailbox read and removed
    assert wait_for_no_ranks() == []


@pytest.mark.integration
def test_a_rank_that_fails_behind_the_relay_is_named_with_its_output(spark, relay_store):
    options = LaunchOptions(spark=spark, engine="tf_collective", relay="always")
    with pytest.raises(RankFailed) as failure:
        HorovodRunner(np=2, options=options).run(fail_on_rank_1)
    message = str(failure.value)
    assert message.startswith("HorovodRunner np=2: rank 1 on "), message
    assert "exited with code 1" in message.splitlines()[0]
    assert "rank 1 gives up" in message and "RuntimeError: no data for rank 1" in message
    assert relay_keys(relay_store) == []
    assert wait_for_no_ranks() == []


@pytest.mark.integration
def test_a_task_refused_by_the_driver_falls_back_to_the_relay(relay_store):
    """The driver's port refuses the task (its listener closed, as a firewall's reject would):
    the task comes through the object store instead, and the run ends as it would have."""
    lines = []
    relay = _relay.relay_spec("fallback", always=False)
    with DriverChannel("127.0.0.1", lines.append, relay=relay) as channel:
        channel._server.shutdown()
        channel._server.server_close()
        spec = TaskSpec(
            payload=pickle_payload(say_and_return, {"tag": "again"}),
            driver_host="127.0.0.1",
            driver_port=channel.port,
            token=channel.token,
            options_env={},
            run_id="fallback",
            start_timeout_s=60.0,
            engine="tf_collective",
            relay=channel.relay.spec,
        )
        result = run_task(spec, 0, ["127.0.0.1"], all_gather=lambda m: [m])
        assert channel.drain(10.0)
        assert cloudpickle.loads(result) == "again from rank 0"
        assert any(line.text == "rank 0 says again" for line in lines), lines
        assert channel.relay.used
    assert relay_keys(relay_store) == []


@pytest.mark.integration
def test_a_task_told_to_close_writes_nothing_after_so_the_run_leaves_nothing(relay_store):
    """The driver closes a task that is still sending (a rank whose peer died, its lines and
    heartbeats going on), then removes the run's objects: what the task sends after it read the
    close must not land in the bucket after that removal (CI found two such batches left)."""
    import threading
    import time

    relay = _relay.relay_spec("closing", always=True)
    peers = []
    driver = _relay.DriverRelay(relay, peers.append)
    task = _relay.TaskRelay(relay, 0)
    stop = threading.Event()

    def chatter():  # a line every 20 ms until told to stop, as a rank's output would be
        n = 0
        while not stop.is_set():
            task.send({"type": "line", "text": f"line {n}"})
            n += 1
            time.sleep(0.02)

    task.send({"type": "hello"})
    talker = threading.Thread(target=chatter, daemon=True)
    talker.start()
    deadline = time.monotonic() + 30
    while not peers and time.monotonic() < deadline:
        time.sleep(0.1)
    assert peers, "the driver never heard the task"
    peers[0].close()  # the run failed elsewhere: the driver tells the task to close
    driver.close()  # waits until the task read that, then removes the run's objects
    assert task.receive() is None  # the task saw the close
    time.sleep(3 * _relay.FLUSH_S)  # its lines go on a moment, as a dying rank's would
    stop.set()
    talker.join()
    task.send({"type": "bye"})
    task.close()
    assert relay_keys(relay_store) == []
