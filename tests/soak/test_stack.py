"""The soak tells each Prefect worker's runner folder from files its runs leave: the folder that
appears as a worker starts is that worker's (a real process that makes one)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.soak.stack import _entries, _new_entry

pytestmark = pytest.mark.integration


def test_the_folder_that_appears_as_a_worker_starts_is_its_own(tmp_path):
    storage = tmp_path / "runner_storage"
    storage.mkdir()
    (storage / "an-earlier-worker").mkdir()
    before = _entries(storage)
    starts = "import os, sys, time; time.sleep(0.5); os.mkdir(sys.argv[1]); time.sleep(30)"
    worker = subprocess.Popen([sys.executable, "-c", starts, str(storage / "this-worker")])
    try:
        found = _new_entry(storage, before, worker, under=tmp_path)
    finally:
        worker.kill()
        worker.wait()
    assert found == "runner_storage/this-worker"


def test_a_worker_that_exits_before_making_one_has_none(tmp_path):
    worker = subprocess.Popen([sys.executable, "-c", "raise SystemExit(1)"])
    assert _new_entry(tmp_path, set(), worker, under=tmp_path.parent) is None
