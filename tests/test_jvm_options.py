"""The suite's JVM class archives do not pile up in the cache, one per clone."""

from __future__ import annotations

import os

import pytest

from tests.jvm_options import prune_archives

pytestmark = pytest.mark.unit


def test_only_the_newest_archives_and_their_locks_are_kept(tmp_path):
    for age, name in enumerate(["a", "b", "c", "d", "e", "f"]):
        archive = tmp_path / f"spark-{name}.jsa"
        archive.write_bytes(b"x")
        (tmp_path / f"spark-{name}.jsa.lock").touch()
        os.utime(archive, (1_000_000 - age, 1_000_000 - age))  # a is the newest
    (tmp_path / "other.file").touch()

    removed = prune_archives(tmp_path, keep=4)

    assert sorted(p.name for p in removed) == ["spark-e.jsa", "spark-f.jsa"]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [f"spark-{n}.jsa{s}" for n in "abcd" for s in ("", ".lock")] + ["other.file"]
    )
