"""The Spark session hvdflow runs on: ``local[N]`` by default, any master when configured."""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Mapping

from pyspark.sql import SparkSession

from infra import constants as c
from infra._env import temporary_env

logger = logging.getLogger(__name__)


def default_master() -> str:
    """``$HVDFLOW_SPARK_MASTER``, else ``local[N]`` with one slot per core."""
    return os.environ.get(c.HVDFLOW_SPARK_MASTER) or f"local[{os.cpu_count() or 1}]"


def executor_python() -> str:
    """The executors' interpreter: ``$PYSPARK_PYTHON`` when set (e.g. ``./environment/bin/python``
    of a packed environment shipped with ``spark.archives``), else this one."""
    return os.environ.get("PYSPARK_PYTHON") or sys.executable


def spark_conf(master: str, extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The conf hvdflow sets on a new session; ``extra`` wins over every default."""
    conf = {
        # Executors must run an interpreter with horovod, petastorm and hvdflow: this one (a
        # shared install), or the packed environment PYSPARK_PYTHON names.
        c.SPARK_PYSPARK_PYTHON: executor_python(),
        c.SPARK_PYSPARK_DRIVER_PYTHON: sys.executable,
        # Fail a barrier stage that cannot get its slots in seconds, not minutes.
        c.SPARK_BARRIER_CHECK_INTERVAL: "1s",
        c.SPARK_BARRIER_CHECK_MAX_FAILURES: "3",
        # Whoever reaches the UI must not be able to stop a training run from it.
        c.SPARK_UI_KILL_ENABLED: "false",
    }
    if master.startswith("local"):
        # The machine's hostname may resolve to an address other processes cannot reach.
        host = os.environ.get(c.SPARK_LOCAL_IP, "127.0.0.1")
        conf[c.SPARK_DRIVER_HOST] = host
        conf[c.SPARK_DRIVER_BIND_ADDRESS] = host
    conf.update(extra or {})
    return conf


def ui_bind_address(conf: Mapping[str, str]) -> str | None:
    """The address the driver's web UI listens on: the driver's bind address.

    Spark 4.0's UI takes it from ``$SPARK_LOCAL_IP`` alone and otherwise listens on every
    interface; ``None`` when neither the conf nor the environment names the driver's address
    (a cluster master with no address configured), which leaves Spark's default.
    """
    return (
        conf.get(c.SPARK_DRIVER_BIND_ADDRESS)
        or conf.get(c.SPARK_DRIVER_HOST)
        or os.environ.get(c.SPARK_LOCAL_IP)
        or None
    )


def launch_env(conf: Mapping[str, str]) -> dict[str, str]:
    """The variables the driver's JVM and its Python workers start with, for ``conf``."""
    # PySpark takes the executors' interpreter from PYSPARK_PYTHON when the context starts (the
    # conf key only reaches spark-submit); it then travels with every Python function.
    env = {"PYSPARK_PYTHON": executor_python(), "PYSPARK_DRIVER_PYTHON": sys.executable}
    address = ui_bind_address(conf)
    if address:
        env[c.SPARK_LOCAL_IP] = address
    return env


def get_spark(
    master: str | None = None,
    app_name: str = "hvdflow",
    conf: Mapping[str, str] | None = None,
) -> SparkSession:
    """The active session if there is one, else a new one on ``master`` (see default_master)."""
    active = SparkSession.getActiveSession()
    if active is not None:
        return active
    # The JVM's active session is per thread; Prefect runs tasks in worker threads. One Spark
    # context per process: reuse the one that exists.
    existing = SparkSession._instantiatedSession
    if existing is not None and existing.sparkContext._jsc is not None:
        return existing
    master = master or default_master()
    builder = SparkSession.builder.master(master).appName(app_name)
    session_conf = spark_conf(master, conf)
    for key, value in session_conf.items():
        builder = builder.config(key, value)
    env = launch_env(session_conf)
    if c.SPARK_LOCAL_IP not in env and session_conf.get(c.SPARK_UI_ENABLED, "true") != "false":
        logger.warning(
            "the Spark UI will listen on every interface: set SPARK_LOCAL_IP or "
            "spark.driver.bindAddress to the driver's address to keep it to that one"
        )
    logger.info("starting Spark session on %s", master)
    with temporary_env(env):
        return builder.getOrCreate()


class SparkProgress:
    """Logs the progress of running Spark stages every few seconds (for Prefect's run logs).

    Spark's console progress bar goes to the terminal only; this goes to ``log``.
    """

    def __init__(self, spark, log, every_s: float = 5.0):
        import threading

        self._tracker = spark.sparkContext.statusTracker()
        self._log = log
        self._every_s = every_s
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._run, daemon=True, name="hvdflow-spark-progress"
        )

    def _run(self) -> None:
        while not self._stop.wait(self._every_s):
            for stage_id in self._tracker.getActiveStageIds():
                info = self._tracker.getStageInfo(stage_id)
                if info is not None:
                    self._log.info(
                        "Spark stage %d (%s): %d/%d tasks done, %d running",
                        stage_id,
                        info.name,
                        info.numCompletedTasks,
                        info.numTasks,
                        info.numActiveTasks,
                    )

    def __enter__(self) -> SparkProgress:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
