"""A rank's folder whose task was killed with its executor (no clean-up ran) is removed by the
next task on that host; a live task's folder is kept."""

from __future__ import annotations

import os
import socket
import subprocess

import pytest

from hvdflow.infra.launcher._task import rank_workdir, remove_orphans

pytestmark = pytest.mark.integration


def test_a_dead_tasks_folder_goes_at_the_next_tasks_start_and_a_live_ones_stays(tmp_path):
    ended = subprocess.Popen(["true"])
    ended.wait()
    here = socket.gethostname()
    dead = tmp_path / f"hvdflow-rank1-pid{ended.pid}@{here}-abc_1234"
    live = tmp_path / f"hvdflow-rank0-pid{os.getppid()}@{here}-def_5678"
    # Another host's (a container sharing this folder): its pid means nothing here.
    elsewhere = tmp_path / f"hvdflow-rank1-pid{ended.pid}@another-host-abc_1234"
    other = tmp_path / f"someone-else-pid{ended.pid}-x"
    for folder in (dead, live, elsewhere, other):
        folder.mkdir()
        (folder / "payload.pkl").write_bytes(b"the user's function")

    assert remove_orphans(str(tmp_path)) == [str(dead)]
    assert not dead.exists() and live.exists() and elsewhere.exists() and other.exists()


def test_a_ranks_folder_is_named_by_its_task_and_goes_with_it(tmp_path, monkeypatch):
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr("tempfile.tempdir", None)  # read TMPDIR again
    with rank_workdir(3) as path:
        name = os.path.basename(path)
        assert name.startswith(f"hvdflow-rank3-pid{os.getpid()}@{socket.gethostname()}-")
        assert os.path.dirname(path) == str(tmp_path)
    assert not os.path.exists(path)
