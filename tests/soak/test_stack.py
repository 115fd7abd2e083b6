"""The soak tells each Prefect worker's runner folder from files its runs leave: the folder that
appears as a worker starts is that worker's (a real process that makes one)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.soak import stack
from tests.soak.stack import _entries, _new_entry

pytestmark = pytest.mark.integration


def test_the_folder_that_appears_as_a_worker_starts_is_its_own(tmp_path):
    storage = tmp_path / "runner_storage"
    storage.mkdir()
    (storage / "an-earlier-worker").mkdir()
    before = _entries(storage)
    starts = (
        "import os, sys, time; time.sleep(0.5); os.mkdir(sys.argv[1]); print('started!',"
        " flush=True); time.sleep(30)"
    )
    log = tmp_path / "worker.log"
    with log.open("w") as out:
        worker = subprocess.Popen(
            [sys.executable, "-c", starts, str(storage / "this-worker")], stdout=out
        )
    try:
        found = _new_entry(storage, before, worker, log, under=tmp_path)
    finally:
        worker.kill()
        worker.wait()
    assert found == "runner_storage/this-worker"


def test_a_worker_that_exits_before_making_one_has_none(tmp_path):
    worker = subprocess.Popen([sys.executable, "-c", "raise SystemExit(1)"])
    assert _new_entry(tmp_path, set(), worker, tmp_path / "no.log", under=tmp_path.parent) is None


@pytest.mark.timeout(120)
def test_a_worker_that_started_without_one_is_not_waited_for(tmp_path, monkeypatch):
    """Prefect 3.9's process worker makes no runner folder: each start of the current profile's
    worker waited WORKER_FOLDER_WAIT_S for one (here an hour: the test's timeout fails it)."""
    monkeypatch.setattr(stack, "WORKER_FOLDER_WAIT_S", 3600.0)
    log = tmp_path / "worker.log"
    says = "import time; print('Worker started!', flush=True); time.sleep(120)"
    with log.open("w") as out:
        worker = subprocess.Popen([sys.executable, "-c", says], stdout=out)
    try:
        found = _new_entry(tmp_path / "runner_storage", set(), worker, log, under=tmp_path)
    finally:
        worker.kill()
        worker.wait()
    assert found is None and worker.returncode == -9  # it ran all along: not a dead worker
