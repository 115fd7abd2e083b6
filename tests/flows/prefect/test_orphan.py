"""A flow run whose Prefect worker is SIGKILLed removes the worker's attempt folder when it ends
(hvdflow.flows.prefect.orphan); under a live worker it leaves the folder to the worker.

Real processes stand in for Prefect's: a "worker" starts the "run" (the flow's process, as
Prefect's supervisor becomes it) and is SIGKILLed, or not, before the run ends. The folders are
laid out as Prefect 3.8's process worker writes them. That a real worker's kill leaves none is
the soak's ``worker_kill`` (docs/benchmarks/cluster.md, "Soak")."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import psutil
import pytest

pytestmark = pytest.mark.integration

MINE, OTHERS = "0b7e5a1c-0000-4000-8000-000000000001", "0b7e5a1c-0000-4000-8000-000000000002"

RUN = """
import os, sys, time
from hvdflow.flows.prefect.orphan import outlive_worker
outlive_worker()
open(sys.argv[1] + ".pid", "w").write(str(os.getpid()))
while not os.path.exists(sys.argv[1]):  # until the test says to end
    time.sleep(0.05)
"""
# The worker starts the run with its own output pipes, as Prefect's does, and outlives it
# unless killed.
WORKER = """
import subprocess, sys, time
run = subprocess.Popen([sys.executable, "-c", sys.argv[1], sys.argv[2]], stdout=subprocess.PIPE)
run.wait()
time.sleep(60)
"""


def attempt_folder(tmp_path, name, flow_run_id):
    folder = tmp_path / f"prefect-workspace-attempt-{name}"
    folder.mkdir()
    (folder / "supervisor.json").write_text(
        json.dumps({"flow_run_id": flow_run_id, "workspace_root": "/x", "command": None})
    )
    (folder / "workspace.json").write_text("{}")
    return folder


def wait_gone(pid: int, timeout_s: float = 30) -> None:
    until = time.monotonic() + timeout_s
    while time.monotonic() < until:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return
        except psutil.NoSuchProcess:
            return
        time.sleep(0.05)
    raise AssertionError(f"the run (pid {pid}) did not end within {timeout_s:g} s")


@pytest.mark.parametrize("worker_killed", [True, False], ids=["worker-killed", "worker-alive"])
def test_the_run_removes_only_its_own_attempt_folder_and_only_when_its_worker_is_gone(
    worker_killed, tmp_path
):
    mine = attempt_folder(tmp_path, "mine", MINE)
    others = attempt_folder(tmp_path, "others", OTHERS)
    not_prefects = tmp_path / "prefect-workspace-attempt-broken"
    not_prefects.mkdir()  # no supervisor.json: not the run's to judge
    end = tmp_path / "end"
    env = {**os.environ, "TMPDIR": str(tmp_path), "PREFECT__FLOW_RUN_ID": MINE}
    worker = subprocess.Popen([sys.executable, "-c", WORKER, RUN, str(end)], env=env)
    try:
        pid_file = tmp_path / "end.pid"
        until = time.monotonic() + 30
        while not (pid_file.exists() and pid_file.read_text()):
            assert time.monotonic() < until and worker.poll() is None, "the run did not start"
            time.sleep(0.05)
        run_pid = int(pid_file.read_text())
        if worker_killed:
            worker.send_signal(signal.SIGKILL)
            worker.wait(timeout=10)
        end.touch()
        wait_gone(run_pid)
    finally:
        worker.kill()
        worker.wait(timeout=10)
    assert mine.exists() is not worker_killed
    assert others.exists() and not_prefects.exists()
