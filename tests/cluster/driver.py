"""Running a Spark driver against the cluster, in a process of its own.

One process holds one SparkContext, and the test session may already hold a ``local[2]`` one
(``hvdflow.get_spark`` returns the active session), so the driver runs in a subprocess in the
root namespace, configured the way a user would configure it: HVDFLOW_SPARK_MASTER and a
spark-defaults.conf in SPARK_CONF_DIR.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from tests.cluster import processes
from tests.cluster.spark_cluster import NetnsSparkCluster

PROJECT_ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class DriverRun:
    returncode: int
    stdout: str
    stderr: str
    seconds: float


def driver_conf(cluster: NetnsSparkCluster) -> dict[str, str]:
    """The session conf for this cluster: one-core executors, one per host."""
    return {
        # Executors in the hosts reach the driver here.
        "spark.driver.host": cluster.driver_ip,
        "spark.driver.bindAddress": cluster.driver_ip,
        "spark.executor.cores": "1",
        # Every host's core, the spare's included: a test may start its worker.
        "spark.cores.max": str(len(cluster.hosts + cluster.spare_hosts)),
        "spark.executor.memory": "1g",
        "spark.ui.enabled": "false",
    }


def write_conf_dir(cluster: NetnsSparkCluster, conf_dir: Path) -> Path:
    """A SPARK_CONF_DIR holding ``driver_conf`` as spark-defaults.conf."""
    conf_dir.mkdir(parents=True, exist_ok=True)
    lines = [f"{key} {value}" for key, value in driver_conf(cluster).items()]
    (conf_dir / "spark-defaults.conf").write_text("\n".join(lines) + "\n")
    return conf_dir


def driver_env(cluster: NetnsSparkCluster, conf_dir: Path) -> dict[str, str]:
    """The driver's environment: this one, pointed at the cluster."""
    env = {k: v for k, v in os.environ.items() if k != "PYSPARK_SUBMIT_ARGS"}
    env.update(
        {
            "HVDFLOW_SPARK_MASTER": cluster.master_url,
            "SPARK_LOCAL_IP": cluster.driver_ip,
            "SPARK_CONF_DIR": str(write_conf_dir(cluster, conf_dir)),
            "PYSPARK_PYTHON": sys.executable,
            "PYSPARK_DRIVER_PYTHON": sys.executable,
        }
    )
    return env


def run_driver(
    cluster: NetnsSparkCluster,
    *python_args: str,
    workdir: Path,
    timeout_s: float = 300.0,
    env: Mapping[str, str] | None = None,
) -> DriverRun:
    """Run ``python *python_args`` (``-c CODE`` or ``-m MODULE ...``) as the cluster's driver,
    with ``env`` on top of ``driver_env``.

    Bounded: past ``timeout_s`` its whole process group (its Spark JVM included) is killed and
    TimeoutError carries the tail of its output.
    """
    workdir.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    proc = subprocess.Popen(
        [sys.executable, *python_args],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**driver_env(cluster, workdir / "conf"), **(env or {})},
        cwd=str(PROJECT_ROOT),
        start_new_session=True,  # its own group: a timeout stops its JVM too
    )
    try:
        stdout, stderr = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        processes.stop_groups([proc], grace_s=5)
        try:
            stdout, stderr = proc.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            stdout, stderr = "", "(its output could not be read)"
        raise TimeoutError(
            f"the driver did not finish within {timeout_s:g} s (run_driver timeout_s); "
            f"its output ends with:\n{stdout[-2000:]}\n{stderr[-4000:]}"
        ) from None
    finally:
        # Also on success or Ctrl-C: nothing of the driver's group (its JVM) outlives it.
        processes.stop_groups([proc], grace_s=5)
    return DriverRun(proc.returncode, stdout, stderr, time.monotonic() - started)


def start_cli(
    cluster: NetnsSparkCluster, argv: list[str], *, workdir: Path, home: Path
) -> subprocess.Popen:
    """``hvdflow <argv>`` as the cluster's driver, in its own process group, with the services
    of ``home`` (HVDFLOW_HOME); stdout and stderr together, for reading line by line."""
    return subprocess.Popen(
        [sys.executable, "-m", "hvdflow.flows.cli", *argv],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**driver_env(cluster, workdir / "conf"), "HVDFLOW_HOME": str(home)},
        cwd=str(PROJECT_ROOT),
        start_new_session=True,  # its own group: stopping it stops its JVM too
    )


def output_acted_on(
    driver: subprocess.Popen, act: Callable[[str], None], timeout_s: float = 600
) -> str:
    """``driver``'s output (its stdout, a line at a time) once it ended, each line handed to
    ``act`` as it came (the moment to strike a fault); the driver's process group is stopped
    whatever happened."""
    output: list[str] = []

    def watch() -> None:
        for line in driver.stdout:
            output.append(line)
            act(line)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        driver.wait(timeout=timeout_s)
        watcher.join(10)
    finally:
        processes.stop_groups([driver], grace_s=5)
    return "".join(output)


def logged_at(line: str) -> float | None:
    """When the driver logged ``line`` (its logging timestamp, local time) in epoch seconds, or
    None for a line without one (a traceback's, Spark's own)."""
    try:
        return datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f").timestamp()
    except ValueError:
        return None
