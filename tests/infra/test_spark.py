"""The Spark session's conf and the driver UI's exposure: exact values, and a real local session."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from hvdflow.infra.connect import is_connect_url
from hvdflow.infra.spark import (
    ConnectClientMissing,
    default_master,
    get_spark,
    launch_env,
    spark_conf,
    ui_bind_address,
)

PY = sys.executable
# What every session hvdflow starts gets, local or not.
EVERY_SESSION = {
    "spark.pyspark.python": PY,
    "spark.pyspark.driver.python": PY,
    "spark.scheduler.barrier.maxConcurrentTasksCheck.interval": "1s",
    "spark.scheduler.barrier.maxConcurrentTasksCheck.maxFailures": "3",
    "spark.ui.killEnabled": "false",
    # Progress goes to the log as lines; Spark's bar would be drawn into them.
    "spark.ui.showConsoleProgress": "false",
}


@pytest.mark.unit
def test_a_local_session_binds_the_driver_to_loopback_and_turns_the_kill_links_off(monkeypatch):
    monkeypatch.delenv("SPARK_LOCAL_IP", raising=False)
    assert spark_conf("local[2]") == {
        **EVERY_SESSION,
        "spark.driver.host": "127.0.0.1",
        "spark.driver.bindAddress": "127.0.0.1",
    }


@pytest.mark.unit
def test_spark_local_ip_chooses_a_local_drivers_address_and_extra_wins(monkeypatch):
    monkeypatch.setenv("SPARK_LOCAL_IP", "10.1.2.3")
    conf = spark_conf("local[1]", {"spark.ui.killEnabled": "true"})
    assert conf["spark.driver.host"] == conf["spark.driver.bindAddress"] == "10.1.2.3"
    assert conf["spark.ui.killEnabled"] == "true"


@pytest.mark.unit
def test_a_cluster_session_leaves_the_drivers_address_to_spark(monkeypatch, tmp_path):
    monkeypatch.delenv("SPARK_LOCAL_IP", raising=False)
    monkeypatch.setenv("SPARK_CONF_DIR", str(tmp_path))  # no spark-defaults.conf
    # Its executors' temporary files go to their work folders (tests/infra/test_executor_jvm.py).
    assert spark_conf("spark://master:7077") == {
        **EVERY_SESSION,
        "spark.executor.extraJavaOptions": "-Djava.io.tmpdir=.",
    }


@pytest.mark.unit
@pytest.mark.parametrize(
    ("conf", "env", "expected"),
    [
        (
            {"spark.driver.bindAddress": "10.0.0.5", "spark.driver.host": "10.0.0.6"},
            None,
            "10.0.0.5",
        ),
        ({"spark.driver.host": "10.0.0.6"}, "10.0.0.7", "10.0.0.6"),
        ({}, "10.0.0.7", "10.0.0.7"),
        ({}, None, None),
    ],
)
def test_the_ui_binds_the_drivers_bind_address(monkeypatch, conf, env, expected):
    if env is None:
        monkeypatch.delenv("SPARK_LOCAL_IP", raising=False)
    else:
        monkeypatch.setenv("SPARK_LOCAL_IP", env)
    assert ui_bind_address(conf) == expected


@pytest.mark.unit
def test_the_jvm_starts_with_the_ui_address_and_this_interpreter(monkeypatch):
    monkeypatch.delenv("SPARK_LOCAL_IP", raising=False)
    assert launch_env(spark_conf("local[2]")) == {
        "PYSPARK_PYTHON": PY,
        "PYSPARK_DRIVER_PYTHON": PY,
        "SPARK_LOCAL_IP": "127.0.0.1",
    }
    assert launch_env(spark_conf("spark://master:7077")) == {
        "PYSPARK_PYTHON": PY,
        "PYSPARK_DRIVER_PYTHON": PY,
    }


# Runs in its own process: one JVM per Python process, and the tests' shared session has no UI.
UI_CHECK = textwrap.dedent(
    """
    import json, socket
    import psutil
    from hvdflow.infra.spark import get_spark

    spark = get_spark("local[1]", "ui-check", {"spark.ui.enabled": "true", "spark.ui.port": "0"})
    try:
        sc = spark.sparkContext
        port = int(sc.uiWebUrl.rsplit(":", 1)[1])
        jvm = psutil.Process(sc._gateway.proc.pid)
        listening = sorted(
            conn.laddr.ip.removeprefix("::ffff:")  # Java's sockets are dual-stack
            for proc in [jvm, *jvm.children(recursive=True)]
            for conn in proc.net_connections("inet")
            if conn.status == psutil.CONN_LISTEN and conn.laddr.port == port
        )
        others = [
            a.address
            for addrs in psutil.net_if_addrs().values()
            for a in addrs
            if a.family == socket.AF_INET and not a.address.startswith("127.")
        ]
        reachable = []
        for address in others:
            try:
                socket.create_connection((address, port), timeout=2).close()
                reachable.append(address)
            except OSError:
                pass
        print(json.dumps({
            "listening": listening,
            "others": others,
            "reachable": reachable,
            "kill": sc.getConf().get("spark.ui.killEnabled"),
        }))
    finally:
        spark.stop()
    """
)


@pytest.mark.integration
def test_a_local_sessions_ui_listens_on_loopback_only_without_kill_links(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "SPARK_LOCAL_IP"}
    done = subprocess.run(
        [PY, "-c", UI_CHECK],
        env=env,
        cwd=os.getcwd(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    found = json.loads(done.stdout.strip().splitlines()[-1])
    assert found["listening"] == ["127.0.0.1"]  # not 0.0.0.0 or ::
    assert found["reachable"] == []  # nor on this machine's other addresses, if it has any
    assert found["kill"] == "false"


@pytest.mark.unit
def test_executors_run_the_interpreter_pyspark_python_names(monkeypatch):
    from hvdflow.infra.spark import launch_env, spark_conf

    monkeypatch.setenv("PYSPARK_PYTHON", "./environment/bin/python")
    conf = spark_conf("spark://master:7077")
    assert conf["spark.pyspark.python"] == "./environment/bin/python"
    assert conf["spark.pyspark.driver.python"] == sys.executable
    assert launch_env(conf)["PYSPARK_PYTHON"] == "./environment/bin/python"
    monkeypatch.delenv("PYSPARK_PYTHON")
    assert spark_conf("spark://master:7077")["spark.pyspark.python"] == sys.executable


@pytest.mark.integration
def test_a_session_draws_no_console_progress_bar_into_the_log(spark):
    # PySpark's own default turns the bar on (spark.ui.showConsoleProgress=true); hvdflow's
    # sessions report stage progress as log lines instead (SparkProgress).
    assert spark.sparkContext.getConf().get("spark.ui.showConsoleProgress") == "false"
    assert spark.sparkContext._jsc.sc().progressBar().isEmpty()


@pytest.mark.integration
def test_a_long_stage_is_logged_as_lines_with_counts_and_a_rate(spark):
    import re
    import time

    from hvdflow.infra.spark import SparkProgress

    class Lines:
        def __init__(self):
            self.lines = []

        def info(self, fmt, *args):
            self.lines.append(fmt % args)

    def slow(partition):
        time.sleep(1.0)
        return partition

    log = Lines()
    with SparkProgress(spark, log, every_s=0.3):
        spark.sparkContext.parallelize(range(6), 6).mapPartitions(slow).count()
        # One more look after the stage ended; Spark's status store may lag behind count().
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and not (
            log.lines and "no longer running" in log.lines[-1]
        ):
            time.sleep(0.1)
    moving = [line for line in log.lines if re.search(r"\d/6 tasks done \(\d+%\)", line)]
    assert moving and all(line.startswith("Spark stage ") for line in moving)
    assert any(re.search(r", [\d.]+ tasks/s$", line) for line in moving)
    assert re.search(r"no longer running \(6 tasks; seen for \d+ s\)$", log.lines[-1])
    assert len(log.lines) <= 8  # a line when it moved, not one every 0.3 s


@pytest.mark.unit
def test_spark_remote_is_the_default_master_after_hvdflows_own(monkeypatch):
    monkeypatch.delenv("HVDFLOW_SPARK_MASTER", raising=False)
    monkeypatch.setenv("SPARK_REMOTE", "sc://spark.example:15002")
    assert default_master() == "sc://spark.example:15002"
    monkeypatch.setenv("HVDFLOW_SPARK_MASTER", "spark://master:7077")
    assert default_master() == "spark://master:7077"
    assert is_connect_url("sc://h:1") and not is_connect_url("spark://h:7077")


@pytest.mark.unit
def test_a_connect_url_without_its_client_says_what_to_install(monkeypatch):
    # As in the classic profile, where gRPC's status protos are missing (or protobuf too old).
    monkeypatch.setattr("pyspark.sql.SparkSession.getActiveSession", lambda: None)
    monkeypatch.setitem(sys.modules, "pyspark.sql.connect.session", None)
    with pytest.raises(ConnectClientMissing) as raised:
        get_spark("sc://spark.example:15002")
    message = str(raised.value)
    assert message.startswith("sc://spark.example:15002: this Python cannot talk to Spark Connect")
    assert "pip install 'hvdflow[connect]'" in message and "\n" not in message


@pytest.mark.unit
def test_no_session_replaces_pysparks_worker_daemon():
    # Python workers start as pyspark starts them: hvdflow's sessions leave the daemon alone.
    assert "spark.python.daemon.module" not in spark_conf("local[1]")
    assert "spark.python.daemon.module" not in spark_conf("spark://master:7077")
