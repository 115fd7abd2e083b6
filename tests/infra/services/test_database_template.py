"""A new home's Prefect and MLflow databases: copies of ones migrated once per version."""

from __future__ import annotations

import logging
import os
import sqlite3

import pytest

from hvdflow.infra.services._database_template import (
    DATABASE_NAME,
    seed_mlflow_database,
    seed_prefect_database,
)
from hvdflow.infra.storage.locks import cache_root

pytestmark = pytest.mark.integration


def tables(path) -> set[str]:
    with sqlite3.connect(path) as db:
        return {row[0] for row in db.execute("SELECT name FROM sqlite_master WHERE type='table'")}


def test_new_homes_get_the_template_made_once_and_a_home_with_a_database_keeps_it(
    tmp_path, monkeypatch
):
    monkeypatch.setenv("HVDFLOW_CACHE_DIR", str(tmp_path / "cache"))
    first, second = tmp_path / "first", tmp_path / "second"
    first.mkdir()
    second.mkdir()
    assert seed_prefect_database(first, dict(os.environ))
    (template,) = (tmp_path / "cache" / "prefect").glob("empty-*.db")
    made = template.stat().st_mtime_ns
    assert {"flow_run", "deployment", "alembic_version"} <= tables(first / DATABASE_NAME)

    assert seed_prefect_database(second, dict(os.environ))
    assert template.stat().st_mtime_ns == made  # copied, not migrated again
    assert (second / DATABASE_NAME).read_bytes() == template.read_bytes()

    (first / DATABASE_NAME).write_bytes(b"the user's runs")
    assert not seed_prefect_database(first, dict(os.environ))
    assert (first / DATABASE_NAME).read_bytes() == b"the user's runs"


def test_a_database_of_the_users_own_gets_no_copy(tmp_path, monkeypatch):
    monkeypatch.setenv("HVDFLOW_CACHE_DIR", str(tmp_path / "cache"))
    env = {**os.environ, "PREFECT_SERVER_DATABASE_CONNECTION_URL": "postgresql+asyncpg://db/p"}
    assert not seed_prefect_database(tmp_path, env)
    assert not (tmp_path / DATABASE_NAME).exists()
    assert not (tmp_path / "cache").exists()


def test_a_cache_that_cannot_hold_the_template_leaves_the_migration_to_prefect(
    tmp_path, monkeypatch, caplog
):
    blocked = tmp_path / "not-a-folder"
    blocked.write_text("")
    monkeypatch.setenv("HVDFLOW_CACHE_DIR", str(blocked))
    with caplog.at_level(logging.WARNING):
        assert not seed_prefect_database(tmp_path, dict(os.environ))
    assert not (tmp_path / DATABASE_NAME).exists()
    assert "Prefect will create its database itself" in caplog.text
    assert str(blocked) in caplog.text


def test_a_new_mlflow_home_gets_the_machines_migrated_template_and_an_old_one_keeps_its_own(
    tmp_path,
):
    # The machine's own cache, as the servers use it: made by the first server of the
    # session if not before, so this test migrates nothing itself after that.
    database = tmp_path / "mlflow.db"
    assert seed_mlflow_database(database, dict(os.environ))
    (template,) = (cache_root() / "mlflow").glob("empty-*.db")
    assert database.read_bytes() == template.read_bytes()
    assert {"experiments", "runs", "registered_models", "alembic_version"} <= tables(database)

    database.write_bytes(b"the user's runs")
    assert not seed_mlflow_database(database, dict(os.environ))
    assert database.read_bytes() == b"the user's runs"
