"""The stall watch: a rank that stops making progress after hvd.init() fails the run, named,
with every rank's Python stacks, and leaves no process behind."""

from __future__ import annotations

import sys
import time

import cloudpickle
import pytest

from hvdflow import HorovodRunner, LaunchOptions, RankFailed
from hvdflow.infra.launcher import _decisions, _wire
from hvdflow.infra.launcher._decisions import RankProgress, culprits, stall_report, stalled
from tests.helpers import wait_for_no_ranks

cloudpickle.register_pickle_by_value(sys.modules[__name__])


def rank_1_sleeps_forever_after_init():
    import horovod.tensorflow as hvd
    import tensorflow as tf

    from hvdflow.infra.launcher._wire import report_progress

    hvd.init()
    if hvd.rank() == 1:
        time.sleep(3600)  # stuck I/O, as far as anyone can tell
    report_progress(begun=1, finished=0)
    hvd.allreduce(tf.constant(1.0))  # waits for rank 1 forever


@pytest.mark.slow
def test_a_rank_that_sleeps_after_init_is_named_with_every_ranks_stacks_within_the_timeout(
    spark,
):
    runner = HorovodRunner(np=2, options=LaunchOptions(spark=spark, stall_timeout_s=8))
    started = time.monotonic()
    with pytest.raises(RankFailed) as failure:
        runner.run(rank_1_sleeps_forever_after_init)
    took = time.monotonic() - started
    message = str(failure.value)
    assert failure.value.cause == _wire.CAUSE_STALLED
    assert failure.value.transient
    assert "rank 1 on " in message.splitlines()[0]
    assert "made no progress for over 8 s (HorovodRunner stall_timeout_s)" in message
    # Both ranks' stacks, each showing where it waits: rank 1 in its sleep, rank 0 in Horovod.
    stacks_0 = message.split("--- Python stacks of rank 0")[1].split("--- Python stacks of")[0]
    stacks_1 = message.split("--- Python stacks of rank 1")[1]
    assert "rank_1_sleeps_forever_after_init" in stacks_1 and "line" in stacks_1
    assert "allreduce" in stacks_0
    # Heartbeats carry progress every 2 s, stacks take a second: found within the timeout's
    # order, not the sleep's hour (start-up of two TensorFlow ranks included).
    assert took < 8 + 60
    assert wait_for_no_ranks() == []


def progress(begun, finished, watch=True, changed=0.0):
    return RankProgress(begun=begun, finished=finished, watch=watch, changed=changed)


@pytest.mark.unit
def test_stalled_ranks_are_the_watched_ones_unchanged_for_longer_than_the_timeout():
    ranks = {
        0: progress(5, 4, changed=100.0),
        1: progress(5, 5, changed=89.0),
        2: progress(3, 3, watch=False, changed=0.0),  # done with its batches: not watched
    }
    assert stalled(ranks, now=110.0, timeout_s=10.0) == [1]
    assert stalled(ranks, now=110.0, timeout_s=21.0) == []
    assert stalled(ranks, now=111.5, timeout_s=10.0) == [0, 1]


@pytest.mark.unit
def test_the_blamed_ranks_are_those_that_began_the_fewest_batches():
    assert culprits({0: progress(1, 0), 1: progress(0, 0)}) == [1]
    assert culprits({0: progress(7, 6), 1: progress(7, 6), 2: progress(7, 6)}) == [0, 1, 2]
    assert culprits({0: progress(2, 2, watch=False), 1: progress(9, 8)}) == [1]
    assert culprits({}) == []


@pytest.mark.unit
def test_the_stall_report_names_the_rank_and_carries_every_ranks_stacks():
    report = stall_report(
        {0: progress(4, 3), 1: progress(3, 3)},
        timeout_s=30,
        stacks={0: "Thread 0x1:\n  File a.py, line 1\n", 1: "Thread 0x2:\n  File b.py, line 2"},
        hosts={0: "hostA", 1: "hostB"},
        now_wall=1234.5,
    )
    assert report["rank"] == 1
    assert report["cause"] == _wire.CAUSE_STALLED
    assert report["exited_at"] == 1234.5
    assert report["reason"].startswith(
        "rank 1 on hostB made no progress for over 30 s (HorovodRunner stall_timeout_s) after "
        "3 finished batch(es); the other ranks wait for it."
    )
    assert report["tail"] == [
        "--- Python stacks of rank 0 on hostA ---",
        "Thread 0x1:",
        "  File a.py, line 1",
        "--- Python stacks of rank 1 on hostB ---",
        "Thread 0x2:",
        "  File b.py, line 2",
    ]


@pytest.mark.unit
def test_a_rank_whose_stacks_never_came_is_said_to_have_sent_none():
    report = stall_report({0: progress(0, 0)}, 10, {}, {}, 0.0)
    assert report["tail"] == ["--- Python stacks of rank 0 ---", "(no stacks arrived from it)"]


@pytest.mark.unit
def test_the_tracker_restarts_the_clock_only_when_a_batch_finishes():
    clock = [0.0]
    tracker = _decisions.ProgressTracker(monotonic=lambda: clock[0])
    tracker.update({"rank": 0, "begun": 1, "finished": 0, "watch": True}, "h")
    clock[0] = 5.0
    tracker.update({"rank": 0, "begun": 2, "finished": 0, "watch": True}, "h")  # begun only
    clock[0] = 10.5
    assert tracker.stalled(10.0) == [0]
    tracker.update({"rank": 0, "begun": 2, "finished": 1, "watch": True}, "h")
    assert tracker.stalled(10.0) == []
    tracker.update({"rank": "x"}, "h")  # from the network: ignored, not raised
    progress_now, hosts = tracker.snapshot()
    assert progress_now == {0: progress(2, 1, changed=10.5)} and hosts == {0: "h"}


@pytest.mark.unit
@pytest.mark.parametrize("value", [0, 5.9, True, "10"])
def test_a_stall_timeout_shorter_than_three_heartbeats_is_refused(value):
    with pytest.raises(ValueError, match="stall_timeout_s="):
        HorovodRunner(np=2, options=LaunchOptions(stall_timeout_s=value))
