"""The Spark session hvdflow runs on: ``local[N]`` by default, any master when configured, or a
remote Spark through Spark Connect (``sc://host:15002``, or the standard ``SPARK_REMOTE``).

A Connect session has no SparkContext and no RDDs: what hvdflow reads from Spark goes through
``spark.conf`` and DataFrames, so that one path serves both kinds of session.
"""

from __future__ import annotations

import logging
import os
import socket
import sys
import threading
import time
from collections.abc import Mapping

from pyspark.sql import SparkSession

from hvdflow.infra import constants as c
from hvdflow.infra._env import temporary_env
from hvdflow.infra.connect import CONNECT_PORT, default_master, is_connect, is_connect_url
from hvdflow.infra.executor_jvm import executor_java_options
from hvdflow.infra.progress import EVERY_S, tasks_line

logger = logging.getLogger(__name__)


class ConnectClientMissing(ImportError):
    """This Python lacks Spark Connect's client (gRPC and its protos), or has one too old."""


def require_connect_client(url: str) -> None:
    """Raise ConnectClientMissing, saying what to install, if this Python cannot talk to Connect."""
    try:
        import pyspark.sql.connect.session  # noqa: F401, PLC0415 (lazy: only for sc:// URLs)
    except ImportError as e:
        reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ConnectClientMissing(
            f"{url}: this Python cannot talk to Spark Connect ({reason}): install its client "
            "with `pip install 'hvdflow[connect]'`. It needs protobuf 5 or newer, which "
            "TensorFlow 2.15 (hvdflow's classic profile) caps below: use the current profile "
            "(`make setup-current`) or an environment of its own"
        ) from None


def client_address(spark) -> str:
    """The address Spark's executors reach this process at: the driver's on a classic session;
    through Connect, ``$SPARK_LOCAL_IP``, else this machine's address on the route to the server."""
    if not is_connect(spark):
        return socket.gethostbyname(spark.conf.get(c.SPARK_DRIVER_HOST))
    chosen = os.environ.get(c.SPARK_LOCAL_IP)
    if chosen:
        return chosen
    server = socket.gethostbyname(spark.client.host)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.connect((server, CONNECT_PORT))  # a datagram socket sends nothing: routing only
        return probe.getsockname()[0]


def executor_python() -> str:
    """The executors' interpreter: ``$PYSPARK_PYTHON`` (e.g. a packed environment shipped with
    ``spark.archives``), else this one."""
    return os.environ.get("PYSPARK_PYTHON") or sys.executable


def spark_conf(master: str, extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The conf hvdflow sets on a new session; ``extra`` wins over every default."""
    conf = {
        c.SPARK_PYSPARK_PYTHON: executor_python(),
        c.SPARK_PYSPARK_DRIVER_PYTHON: sys.executable,
        # Fail a barrier stage that cannot get its slots in seconds, not minutes.
        c.SPARK_BARRIER_CHECK_INTERVAL: "1s",
        c.SPARK_BARRIER_CHECK_MAX_FAILURES: "3",
        c.SPARK_UI_KILL_ENABLED: "false",
        c.SPARK_UI_SHOW_CONSOLE_PROGRESS: "false",
    }
    if master.startswith("local"):
        # The machine's hostname may resolve to an address other processes cannot reach.
        host = os.environ.get(c.SPARK_LOCAL_IP, "127.0.0.1")
        conf[c.SPARK_DRIVER_HOST] = host
        conf[c.SPARK_DRIVER_BIND_ADDRESS] = host
    conf.update(extra or {})
    conf.update(executor_java_options(master, extra))
    return conf


def ui_bind_address(conf: Mapping[str, str]) -> str | None:
    """The address the driver's web UI is to listen on (through ``$SPARK_LOCAL_IP``): the
    driver's bind address; None when nothing names it, which leaves Spark's default."""
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
    """The active session if there is one, else a new one on ``master`` (see default_master): a
    Spark Connect session on an ``sc://`` URL (only ``conf``'s session settings apply there),
    else a classic one."""
    active = SparkSession.getActiveSession()
    if active is not None:
        return active
    master = master or default_master()
    if is_connect_url(master):
        require_connect_client(master)
        builder = SparkSession.builder.remote(master).appName(app_name)
        for key, value in (conf or {}).items():
            builder = builder.config(key, value)
        logger.info("connecting to Spark Connect at %s", master)
        return builder.getOrCreate()
    # The JVM's active session is per thread; Prefect runs tasks in worker threads. One Spark
    # context per process: reuse the one that exists.
    existing = SparkSession._instantiatedSession
    if existing is not None and existing.sparkContext._jsc is not None:
        return existing
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


class StageProgress:
    """Which progress lines to log for Spark's active stages, given what was seen before: a
    stage when first seen, then only when its completed count moved (with its rate), and one
    closing line when no longer active. Pure: ``update`` takes plain values and a time.
    """

    def __init__(self):
        # stage id -> (name, first seen at, tasks done when first seen, done at last report,
        # total tasks)
        self._seen: dict[int, tuple[str, float, int, int, int]] = {}

    def update(self, stages: list[tuple[int, str, int, int, int]], now: float) -> list[str]:
        """``stages``: (id, name, tasks done, tasks in all, tasks running) of each active stage."""
        lines = []
        active = set()
        for stage_id, name, done, total, running in stages:
            active.add(stage_id)
            seen = self._seen.get(stage_id)
            if seen is None:
                self._seen[stage_id] = (name, now, done, done, total)
                lines.append(tasks_line(stage_id, name, done, total, running, None))
                continue
            _name, since, done_then, reported, _total = seen
            if done != reported:
                rate = (done - done_then) / (now - since) if now > since else None
                lines.append(tasks_line(stage_id, name, done, total, running, rate))
                self._seen[stage_id] = (name, since, done_then, done, total)
        for stage_id in sorted(set(self._seen) - active):
            name, since, _done_then, _reported, total = self._seen.pop(stage_id)
            lines.append(
                f"Spark stage {stage_id} ({name}): no longer running ({total} tasks; seen "
                f"for {now - since:.0f} s)"
            )
        return lines


class SparkProgress:
    """Logs the progress of running Spark stages as lines, at most one per stage every
    ``every_s`` seconds, for the terminal and Prefect's run logs alike."""

    def __init__(self, spark, log, every_s: float = EVERY_S):
        # Classic: the driver's status tracker, polled. Spark Connect: the stages the server
        # reports with each operation's responses (a progress handler), kept until polled.
        self._spark = spark
        self._tracker = None if is_connect(spark) else spark.sparkContext.statusTracker()
        self._reported: dict[str | None, list[tuple[int, str, int, int, int]]] = {}
        self._log = log
        self._every_s = every_s
        self._stages = StageProgress()
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._run, daemon=True, name="hvdflow-spark-progress"
        )

    def _on_connect_progress(self, stages, inflight_tasks, operation_id, done) -> None:
        """Spark Connect's progress handler: the operation's stages, as the server sent them."""
        if done:
            self._reported.pop(operation_id, None)
            return
        self._reported[operation_id] = [
            (
                s.stage_id,
                "through Spark Connect",
                s.num_completed_tasks,
                s.num_tasks,
                min(inflight_tasks, s.num_tasks - s.num_completed_tasks),
            )
            for s in stages or ()
            if not s.done
        ]

    def _active(self) -> list[tuple[int, str, int, int, int]]:
        if self._tracker is None:
            return [stage for stages in list(self._reported.values()) for stage in stages]
        stages = []
        for stage_id in self._tracker.getActiveStageIds():
            info = self._tracker.getStageInfo(stage_id)
            if info is not None:
                stages.append(
                    (
                        stage_id,
                        info.name,
                        info.numCompletedTasks,
                        info.numTasks,
                        info.numActiveTasks,
                    )
                )
        return stages

    def _run(self) -> None:
        while not self._stop.wait(self._every_s):
            try:
                for line in self._stages.update(self._active(), time.monotonic()):
                    self._log.info("%s", line)
            except Exception as e:  # progress is best effort: it never fails the job
                logger.debug("Spark progress unavailable: %s", e)

    def __enter__(self) -> SparkProgress:
        if self._tracker is None:
            self._spark.registerProgressHandler(self._on_connect_progress)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        if self._tracker is None:
            self._spark.removeProgressHandler(self._on_connect_progress)
