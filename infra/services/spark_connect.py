"""A Spark Connect server from pyspark's own jars: the remote Spark a thin client reaches at
``sc://host:port``, on ``local[N]`` or a standalone master.

What ``$SPARK_HOME/sbin/start-connect-server.sh`` runs, in the foreground. Its executors run this
Python unless ``PYSPARK_PYTHON`` names another; barrier checks and executors' temporary folders
are as in hvdflow's own sessions. The server's JVM keeps its temporary files in its home
(``tmp``): Spark leaves its ML model cache in ``java.io.tmpdir`` after the server stops.
"""

from __future__ import annotations

import os
import socket
import sys
from pathlib import Path

from hvdflow.infra import constants as c
from hvdflow.infra.executor_jvm import executor_java_options, spark_defaults
from hvdflow.infra.services._process import LOOPBACK, url_host
from hvdflow.infra.services._service import Service

SERVER_CLASS = "org.apache.spark.sql.connect.service.SparkConnectServer"


def spark_home() -> Path:
    """The installed pyspark's folder, which holds Spark's jars and scripts."""
    import pyspark  # noqa: PLC0415 (only for its path)

    return Path(pyspark.__file__).parent


class SparkConnectServer(Service):
    """``SparkConnectServer`` on ``host``:``port`` over ``master`` (``local[2]`` by default);
    ``conf``: more Spark settings for the server's own session."""

    name = "Spark Connect server"
    log_name = "spark-connect.log"
    START_TIMEOUT_S = 120.0
    STOP_TIMEOUT_S = 15.0
    POLL_INTERVAL_S = 0.5

    def __init__(
        self,
        home: str | Path,
        port: int | None = None,
        *,
        host: str = LOOPBACK,
        master: str = "local[2]",
        conf: dict[str, str] | None = None,
    ):
        super().__init__(home, port, host=host)
        self.master = master
        self.conf = dict(conf or {})

    @property
    def url(self) -> str:
        return f"sc://{url_host(self.host)}:{self.port}"

    def env(self) -> dict[str, str]:
        """SPARK_REMOTE: the variable a Spark Connect client reads its server from."""
        return {c.SPARK_REMOTE: self.url}

    def _command(self) -> list[str]:
        conf = {
            "spark.connect.grpc.binding.address": self.host,
            "spark.connect.grpc.binding.port": str(self.port),
            c.SPARK_DRIVER_HOST: self.host,
            c.SPARK_DRIVER_BIND_ADDRESS: self.host,
            c.SPARK_BARRIER_CHECK_INTERVAL: "1s",
            c.SPARK_BARRIER_CHECK_MAX_FAILURES: "3",
            c.SPARK_UI_ENABLED: "false",
            "spark.local.dir": str(self.home / "local"),
            **self.conf,
        }
        defaults = spark_defaults(self.conf_dir)
        conf.update(executor_java_options(self.master, self.conf, defaults))
        conf.update(self._server_java_options(defaults))
        command = [str(spark_home() / "bin" / "spark-submit"), "--master", self.master]
        for key, value in conf.items():
            command += ["--conf", f"{key}={value}"]
        return [*command, "--class", SERVER_CLASS]

    @property
    def tmp_dir(self) -> Path:
        """The server JVM's temporary folder (``java.io.tmpdir``)."""
        return self.home / "tmp"

    @property
    def conf_dir(self) -> Path:
        """Where the server's spark-submit reads spark-defaults.conf: ``$SPARK_HOME/conf`` (its
        environment drops a client's SPARK_CONF_DIR), pyspark's own without a SPARK_HOME."""
        return Path(os.environ.get("SPARK_HOME") or spark_home()) / "conf"

    def _server_java_options(self, defaults: dict[str, str]) -> dict[str, str]:
        """The server JVM's options with its temporary folder at home: added to what ``conf``
        or spark-defaults.conf (``defaults``) give it, and nothing where those name one."""
        key = c.SPARK_DRIVER_EXTRA_JAVA_OPTIONS
        given = self.conf.get(key) or defaults.get(key, "")
        if "-Djava.io.tmpdir=" in given:
            return {}
        return {key: f"{given} -Djava.io.tmpdir={self.tmp_dir}".strip()}

    def _prepare(self) -> None:
        super()._prepare()
        self.tmp_dir.mkdir(exist_ok=True)

    def _env(self) -> dict[str, str]:
        # A client's settings (SPARK_REMOTE, a conf dir) must not turn the server into a client.
        env = {k: v for k, v in os.environ.items() if k not in (c.SPARK_REMOTE, "SPARK_CONF_DIR")}
        env.setdefault("PYSPARK_PYTHON", sys.executable)
        env[c.SPARK_LOCAL_IP] = self.host
        return env

    def _ready(self) -> bool:
        with socket.create_connection((self.host, self.port), timeout=2):
            return True
