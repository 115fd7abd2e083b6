"""Why a task stops its rank, and what a rank's exit means: exact values."""

from __future__ import annotations

import pytest

from hvdflow.infra.launcher import _wire
from hvdflow.infra.launcher._decisions import error_line, exit_cause, reached_in_time, stop_reason

pytestmark = pytest.mark.unit

RUNNING = dict(
    aborted=False,
    driver_silent=False,
    init_reached=True,
    waited_s=1000.0,
    start_timeout_s=300.0,
    heartbeat_timeout_s=60.0,
)


def test_a_rank_that_reached_init_with_a_live_driver_runs_on():
    assert stop_reason(**RUNNING) is None
    # Before hvd.init(), only while the start timeout has not passed.
    assert stop_reason(**{**RUNNING, "init_reached": False, "waited_s": 300.0}) is None


def test_a_cancelled_run_stops_its_rank_whatever_else_holds():
    everything = {**RUNNING, "aborted": True, "driver_silent": True, "init_reached": False}
    assert stop_reason(**everything) == (
        "stopped: the driver cancelled the run",
        _wire.CAUSE_STOPPED,
    )


def test_a_silent_driver_stops_the_rank_naming_the_timeout():
    assert stop_reason(**{**RUNNING, "driver_silent": True, "init_reached": False}) == (
        "stopped: heard nothing from the driver for 60 s (HorovodRunner heartbeat_timeout_s); "
        "the driver, or the network to it, is gone",
        _wire.CAUSE_LOST,
    )


def test_a_rank_that_never_reached_init_is_stopped_after_the_start_timeout():
    assert stop_reason(**{**RUNNING, "init_reached": False, "waited_s": 300.5}) == (
        "did not reach hvd.init() within 300 s (HorovodRunner start_timeout_s): raise it if "
        "main does slow work before hvd.init(), or look for a rank stuck at start in its output",
        _wire.CAUSE_START_TIMEOUT,
    )
    late = {**RUNNING, "init_reached": False, "waited_s": 300.5, "engine": _wire.TF_COLLECTIVE}
    assert stop_reason(**late)[0].startswith(
        "did not reach tf.distribute.MultiWorkerMirroredStrategy() within 300 s"
    )


@pytest.mark.parametrize(
    "returncode, cause, transient",
    [
        (-9, _wire.CAUSE_SIGNAL, True),
        (-15, _wire.CAUSE_SIGNAL, True),
        (1, _wire.CAUSE_EXIT, False),
        (75, _wire.CAUSE_UNAVAILABLE, True),  # EX_TEMPFAIL: a service was unreachable
    ],
)
def test_a_signal_or_tempfail_is_a_transient_cause_and_another_exit_status_is_not(
    returncode, cause, transient
):
    assert exit_cause(returncode) == cause
    assert (cause in _wire.TRANSIENT_CAUSES) is transient


@pytest.mark.parametrize(
    "tail, expected",
    [
        (
            [
                "[1,0]<stderr>:Traceback (most recent call last):",
                '[1,0]<stderr>:  File "x.py", line 1, in <module>',
                "[1,0]<stderr>:hvdflow.infra.storage.object_store.ObjectStoreError: object store "
                "at http://10.0.0.1:8333 is unreachable after 4 attempts",
                "[1,0]<stdout>:cleaning up",
            ],
            "ObjectStoreError: object store at http://10.0.0.1:8333 is unreachable after 4 "
            "attempts",
        ),
        (["[1,1]<stderr>:ValueError: bad value"], "ValueError: bad value"),
        # TensorFlow's coordination service aborted the collectives: the rank it names is said,
        # in 2.15's words too.
        (
            [
                "[1,0]<stderr>:tensorflow.python.framework.errors_impl.UnavailableError: Graph "
                "execution error:",
                "[1,0]<stderr>:Collective ops is aborted by: Error reported from "
                "/job:worker/task:1: Task /job:worker/replica:0/task:1 heartbeat timeout. This "
                "indicates that the remote task has failed, got preempted, or crashed.",
            ],
            "UnavailableError: rank 1 stopped sending heartbeats (TensorFlow's coordination "
            "service aborted the collectives: its host unreachable, or its process stopped)",
        ),
        (
            [
                "[1,0]<stderr>:tensorflow.python.framework.errors_impl.UnavailableError: Graph "
                "execution error:",
                "[1,0]<stderr>:",
                "[1,0]<stderr>:Collective ops is aborted by: Error reported from "
                "/job:worker/task:1: The following tasks are unhealthy (stopped sending "
                "heartbeats):",
                "[1,0]<stderr>:/job:worker/replica:0/task:1",
                "[1,0]<stderr>:The tasks have crashed. Check the task logs for an earlier error.",
            ],
            "UnavailableError: rank 1 stopped sending heartbeats (TensorFlow's coordination "
            "service aborted the collectives: its host unreachable, or its process stopped)",
        ),
        # A worker whose heartbeats the coordination service (rank 0's host, cut off) did not
        # answer in time (TensorFlow 2.21; the soak of 2026-11-30).
        (
            [
                "[1,1]<stderr>:E0000 base_collective_executor.cc:252] BaseCollectiveExecutor::"
                "StartAbort DEADLINE_EXCEEDED: Deadline Exceeded",
                "[1,1]<stderr>:",
                "[1,1]<stderr>:RPC: /tensorflow.CoordinationService/Heartbeat",
                "[1,1]<stderr>:tensorflow.python.framework.errors_impl.DeadlineExceededError: "
                "Graph execution error:",
                "[1,1]<stderr>:Collective ops is aborted by: Deadline Exceeded",
            ],
            "DeadlineExceededError: TensorFlow's coordination service, on rank 0, did not answer "
            "this rank's heartbeats in time (rank 0's host unreachable, or its process stopped)",
        ),
        (["[1,0]<stdout>:Epoch 3/8", "[1,0]<stderr>:Killed"], None),
        # A peer's death seen by this rank is not what happened to it.
        (["[1,1]<stderr>:RuntimeError: Horovod has been shut down. This was caused by"], None),
        ([], None),
    ],
)
def test_the_error_line_is_the_exception_a_ranks_output_ends_with(tail, expected):
    assert error_line(tail) == expected


@pytest.mark.unit
def test_a_rank_that_reached_its_start_after_the_timeout_did_not_reach_it_in_time():
    """Judged by when the rank got there, not by the task's next look (a forked rank got to
    hvd.init() between two looks, after a 0.01 s timeout, and the run went on)."""
    assert reached_in_time(None, 30.0) is False
    assert reached_in_time(30.0, 30.0) is True
    assert reached_in_time(30.001, 30.0) is False
    assert reached_in_time(0.05, 0.01) is False
