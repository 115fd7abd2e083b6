"""Session-wide real services: each fixture starts the thing once and stops what it started."""

from __future__ import annotations

import os

import pytest

# The machine's hostname may resolve to an address that is not on any interface here.
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")


@pytest.fixture(scope="session")
def spark(tmp_path_factory):
    """One local[2] Spark session for the whole run (its JVM takes 10-30 s to start)."""
    from infra.spark import get_spark

    session = get_spark(
        "local[2]",
        "hvdflow-tests",
        {
            "spark.ui.enabled": "false",
            "spark.local.dir": str(tmp_path_factory.mktemp("spark-local")),
            "spark.sql.shuffle.partitions": "2",
        },
    )
    yield session
    session.stop()
