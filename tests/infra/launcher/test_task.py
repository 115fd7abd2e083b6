"""The task: how a rank's exit reads in an error, and the hostname check before any rank starts."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys

import cloudpickle
import pytest

from hvdflow.infra.launcher import _task, _wire
from hvdflow.infra.launcher._decisions import exit_reason
from hvdflow.infra.launcher._task import run_task
from hvdflow.infra.launcher.errors import RankFailed
from tests.infra.launcher.fake_driver import SilentDriver, spec_for

cloudpickle.register_pickle_by_value(sys.modules[__name__])


@pytest.mark.unit
@pytest.mark.parametrize(
    "returncode, reason",
    [
        (1, "exited with code 1"),
        (
            75,
            "exited with code 75 (a temporary failure: another attempt may succeed)",
        ),  # EX_TEMPFAIL
        (137, "exited with code 137"),  # a shell's "killed": the status the rank itself chose
        (-9, "was killed by SIGKILL (exit -9)"),
        (-15, "was killed by SIGTERM (exit -15)"),
        (-11, "was killed by SIGSEGV (exit -11)"),
        (-6, "was killed by SIGABRT (exit -6)"),
        (-99, "was killed by signal 99 (exit -99)"),
    ],
)
def test_a_negative_exit_status_is_named_by_its_signal(returncode, reason):
    assert exit_reason(returncode) == reason


def must_not_run():
    raise AssertionError("a rank started on a host whose name resolves to loopback")


@pytest.mark.integration
def test_a_host_whose_name_resolves_to_loopback_fails_before_starting_a_multi_host_rank(
    monkeypatch,
):
    monkeypatch.setattr(_task, "_resolve", lambda hostname: "127.0.1.1")
    host = socket.gethostname()
    driver = SilentDriver()
    try:
        spec = spec_for(driver, cloudpickle.dumps((must_not_run, {})), heartbeat_timeout_s=60)
        with pytest.raises(RankFailed) as err:
            run_task(spec, 1, ["127.0.0.1", "127.0.0.2"])
        # Read while the driver still listens: on a busy machine the report may arrive after
        # run_task has raised.
        reports = driver.messages(_wire.FAILED)
    finally:
        driver.shutdown()
        driver.server_close()
    reason = (
        f"rank 1 on {host} (127.0.0.2) cannot start: host {host} resolves to 127.0.1.1; Gloo "
        f"peers on other hosts would be told to connect there: map {host} to 127.0.0.2 (this "
        "executor's address) in /etc/hosts or DNS"
    )
    assert str(err.value) == reason
    [report] = reports
    assert (report["rank"], report["reason"], report["tail"]) == (1, reason, [])


# A rank that says it handled SIGTERM, then exits as a Python does on it.
ON_SIGTERM = """
import signal, sys, time
def stop(*_):
    print("handled SIGTERM", flush=True)
    sys.exit(143)
signal.signal(signal.SIGTERM, stop)
print("ready", flush=True)
while True:
    time.sleep(1)
"""


@pytest.mark.integration
def test_a_stopped_rank_is_woken_to_handle_sigterm_and_not_killed_after_the_grace():
    """A rank frozen by SIGSTOP (the soak's tf_collective fault) handled nothing before: SIGTERM
    stayed pending, SIGKILL came 3 s later, and its cleanup never ran."""
    proc = subprocess.Popen(
        [sys.executable, "-c", ON_SIGTERM],
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        assert proc.stdout.readline().strip() == "ready"
        proc.send_signal(signal.SIGSTOP)
        _task._kill_group(proc)
        # Its own exit, not SIGKILL's -9.
        assert (proc.stdout.read().strip(), proc.returncode) == ("handled SIGTERM", 143)
    finally:
        proc.kill()
