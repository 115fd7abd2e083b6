"""A process whose output pipes lose their reader mid-run (a Prefect worker SIGKILLed under its
flow run) goes on writing: hvdflow.infra.stdio. Without it, the same writes kill the process."""

from __future__ import annotations

import subprocess
import sys

import pytest

pytestmark = pytest.mark.integration

CHILD = """
import os, sys
if sys.argv[1] == "guarded":
    from hvdflow.infra.stdio import outlive_reader
    outlive_reader()
print("ready", flush=True)
sys.stdin.readline()  # the parent has closed its ends of both pipes by now
sys.stdout.write("View run at: http://mlflow/#/runs/1\\n")  # what MLflow's end_run prints
sys.stdout.flush()
print("to stderr", file=sys.stderr, flush=True)
os.write(1, b"from C code, after the switch\\n")
open(sys.argv[2], "w").write("went on")
"""


@pytest.mark.parametrize("guarded", [True, False], ids=["guarded", "unguarded"])
def test_writes_after_the_reader_is_gone_go_on_only_when_guarded(guarded, tmp_path):
    marker = tmp_path / "went-on"
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, "guarded" if guarded else "bare", str(marker)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert child.stdout.readline() == b"ready\n"
    child.stdout.close()  # the reader goes, as a dead worker's end of the pipe does
    child.stderr.close()
    child.stdin.write(b"go\n")
    child.stdin.close()
    code = child.wait(timeout=60)
    if guarded:
        assert (code, marker.read_text()) == (0, "went on")
    else:
        assert code != 0 and not marker.exists()


# As a flow run's process: Prefect's logging (its console handler holds sys.stderr as it was at
# import), then outlive_reader(), then a thread that logs, as the driver channel logs rank
# lines. Rich, which Prefect's console handler prints with, raises SystemExit on a broken pipe.
LOGGING_CHILD = """
import logging, sys, threading
from prefect.logging.configuration import setup_logging
setup_logging()  # as a flow run's engine does: a console handler on the root logger
from hvdflow.infra.stdio import outlive_reader
outlive_reader()
print("ready", flush=True)
sys.stdin.readline()  # the parent has closed its end of stderr by now
said = []
def rank_lines():
    for i in range(50):
        logging.getLogger("hvdflow.ranks").warning("[1,0]<stdout>:Epoch %d/50", i)
        said.append(i)
reader = threading.Thread(target=rank_lines)
reader.start()
reader.join()
open(sys.argv[1], "w").write(str(len(said)))
"""


def test_a_thread_that_logs_after_the_reader_is_gone_goes_on(tmp_path):
    """The soak's killed Prefect workers cost every run an attempt: the driver's channel thread
    for rank 0 met the dead pipe in Prefect's console handler, Rich raised SystemExit, the
    thread ended, and the driver took rank 0's task for lost."""
    said = tmp_path / "said"
    child = subprocess.Popen(
        [sys.executable, "-c", LOGGING_CHILD, str(said)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert child.stdout.readline() == b"ready\n"
    child.stderr.close()  # the worker's end of the pipe goes with the worker
    child.stdin.write(b"go\n")
    child.stdin.close()
    assert child.wait(timeout=120) == 0
    assert said.read_text() == "50"
