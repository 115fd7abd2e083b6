"""The rank process entry point, started as the task starts it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import cloudpickle
import pytest

from hvdflow.infra.constants import HVDFLOW_PARENT_PID

pytestmark = pytest.mark.integration

# Rank functions are shipped by value, as a notebook's are.
cloudpickle.register_pickle_by_value(sys.modules[__name__])


def write_marker(path):
    with open(path, "w") as f:
        f.write("main ran")
    return "done"


def start_rank(tmp_path, parent_pid: int) -> tuple[subprocess.CompletedProcess, str]:
    marker = tmp_path / "main-ran"
    payload, result = tmp_path / "payload.pkl", tmp_path / "result.pkl"
    payload.write_bytes(cloudpickle.dumps((write_marker, {"path": str(marker)})))
    rank = subprocess.run(
        [sys.executable, "-m", "hvdflow.infra.launcher._rank", str(payload), str(result)],
        env={**os.environ, HVDFLOW_PARENT_PID: str(parent_pid)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    return rank, marker


def test_a_rank_whose_task_is_already_gone_exits_before_running_main(tmp_path):
    # The task died between starting the rank and the rank's PR_SET_PDEATHSIG: the rank's
    # parent is no longer the pid the task passed down.
    gone = subprocess.Popen(["true"])
    gone.wait()
    rank, marker = start_rank(tmp_path, parent_pid=gone.pid)
    assert rank.returncode == 128 + signal.SIGKILL, rank.stderr
    assert not marker.exists()


def test_a_rank_started_by_its_task_runs_main_and_returns_the_result(tmp_path):
    rank, marker = start_rank(tmp_path, parent_pid=os.getpid())
    assert rank.returncode == 0, rank.stderr
    assert marker.read_text() == "main ran"
    assert cloudpickle.loads((tmp_path / "result.pkl").read_bytes()) == "done"


def test_tensorflows_errors_for_a_peer_out_of_reach_are_temporary():
    """UNAVAILABLE (a worker's heartbeats stopped reaching the coordination service) and
    DEADLINE_EXCEEDED (the coordination service stopped answering a worker's, in the soak of
    2026-11-30): the training step runs both again; a Python error inside them it does not."""
    tf = pytest.importorskip("tensorflow")
    from hvdflow.infra.launcher._rank import _transient

    def raised(error):
        try:
            try:
                raise error
            except Exception as e:
                raise RuntimeError("in the user's main") from e
        except RuntimeError as wrapped:
            return wrapped

    assert _transient(raised(tf.errors.UnavailableError(None, None, "heartbeats stopped")))
    assert _transient(raised(tf.errors.DeadlineExceededError(None, None, "Deadline Exceeded")))
    assert not _transient(raised(tf.errors.InvalidArgumentError(None, None, "a bad shape")))
