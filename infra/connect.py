"""What tells a Spark Connect session or URL apart from a classic one, without importing Spark
(the launcher's faces and the steps ask before any session exists)."""

from __future__ import annotations

import os

from hvdflow.infra import constants as c

# Spark Connect's URL scheme: ``sc://host:port/;param=value``.
CONNECT_SCHEME = "sc://"
# Spark Connect's default port, where a URL names none.
CONNECT_PORT = 15002


def default_master() -> str:
    """``$HVDFLOW_SPARK_MASTER``, else ``$SPARK_REMOTE`` (Spark Connect's own variable), else
    ``local[N]`` with one slot per core."""
    return (
        os.environ.get(c.HVDFLOW_SPARK_MASTER)
        or os.environ.get(c.SPARK_REMOTE)
        or f"local[{os.cpu_count() or 1}]"
    )


def is_connect_url(master: str | None) -> bool:
    """Whether ``master`` names a Spark Connect server (``sc://...``) rather than a master."""
    return bool(master) and master.startswith(CONNECT_SCHEME)


def is_connect(spark) -> bool:
    """Whether ``spark`` is a Spark Connect session (no SparkContext, no RDDs, no JVM here)."""
    return type(spark).__module__.startswith("pyspark.sql.connect")
