"""The suite's JVM class archives: one per set of Spark jars, whichever clone links them, and
no pile-up in the cache."""

from __future__ import annotations

import os
import shutil

import pytest

from tests.jvm_options import jars_identity, prune_archives

pytestmark = pytest.mark.unit


def test_only_the_newest_archives_their_locks_and_linked_spark_homes_are_kept(tmp_path):
    for age, name in enumerate(["a", "b", "c", "d", "e", "f"]):
        archive = tmp_path / f"spark-{name}.jsa"
        archive.write_bytes(b"x")
        (tmp_path / f"spark-{name}.jsa.lock").touch()
        (tmp_path / f"spark-{name}" / "jars").mkdir(parents=True)
        os.utime(archive, (1_000_000 - age, 1_000_000 - age))  # a is the newest
    (tmp_path / "other.file").touch()

    removed = prune_archives(tmp_path, keep=4)

    assert sorted(p.name for p in removed) == ["spark-e.jsa", "spark-f.jsa"]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [f"spark-{n}{s}" for n in "abcd" for s in ("", ".jsa", ".jsa.lock")] + ["other.file"]
    )


def test_jars_linked_from_one_template_are_one_identity_and_copies_another(tmp_path):
    template = tmp_path / "template" / "jars"
    template.mkdir(parents=True)
    (template / "spark-core.jar").write_bytes(b"core")
    (template / "py4j.jar").write_bytes(b"py4j")
    linked = [tmp_path / clone / "jars" for clone in ("one", "two")]
    for jars in linked:
        shutil.copytree(template, jars, copy_function=os.link)
    (linked[1] / "connect-repl").mkdir()  # a folder of each clone's own does not count
    copied = shutil.copytree(template, tmp_path / "copied" / "jars")

    assert jars_identity(linked[0]) == jars_identity(linked[1]) == jars_identity(template)
    assert jars_identity(copied) != jars_identity(template)
