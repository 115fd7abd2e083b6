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
