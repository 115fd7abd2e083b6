"""The tracking database after an interrupted schema migration: recovered, or left with steps."""

from __future__ import annotations

import sqlite3

import pytest

from hvdflow.infra.services.mlflow_server import recover_interrupted_migration

pytestmark = pytest.mark.unit


def test_what_an_interrupted_migration_left_is_dropped_and_the_database_kept_aside(tmp_path):
    database = tmp_path / "mlflow.db"
    with sqlite3.connect(database) as db:
        db.execute("CREATE TABLE experiments (id INTEGER, name TEXT)")
        db.execute("INSERT INTO experiments VALUES (1, 'kept')")
        db.execute("CREATE TABLE _alembic_tmp_experiments (id INTEGER, name TEXT)")
    assert recover_interrupted_migration(database) == ["_alembic_tmp_experiments"]
    with sqlite3.connect(database) as db:
        tables = {row[0] for row in db.execute("SELECT name FROM sqlite_master")}
        assert tables == {"experiments"}
        assert db.execute("SELECT name FROM experiments").fetchall() == [("kept",)]
    (backup,) = tmp_path.glob("mlflow.db.before-recovery-*")
    with sqlite3.connect(backup) as db:
        assert {row[0] for row in db.execute("SELECT name FROM sqlite_master")} == {
            "experiments",
            "_alembic_tmp_experiments",
        }
    assert recover_interrupted_migration(database) == []  # nothing left to do


def test_a_copy_without_its_original_is_left_for_a_person_with_the_steps(tmp_path):
    database = tmp_path / "mlflow.db"
    with sqlite3.connect(database) as db:
        db.execute("CREATE TABLE _alembic_tmp_model_versions (name TEXT)")
    with pytest.raises(RuntimeError) as refused:
        recover_interrupted_migration(database)
    assert "_alembic_tmp_model_versions" in str(refused.value)
    assert "ALTER TABLE _alembic_tmp_model_versions RENAME TO model_versions" in str(refused.value)
    with sqlite3.connect(database) as db:  # untouched
        assert [row[0] for row in db.execute("SELECT name FROM sqlite_master")] == [
            "_alembic_tmp_model_versions"
        ]
