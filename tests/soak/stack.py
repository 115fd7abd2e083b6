"""The long-lived parts of a soak: the multi-host cluster, hvdflow's services bound to its
driver's address, the deployments (``hvdflow deploy``) and a Prefect worker started in an empty
folder, as production runs them; and the restarts the faults need."""

from __future__ import annotations

import contextlib
import io
import json
import os
import signal
import subprocess
import sys
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from hvdflow.infra.services._process import (
    free_port,
    group_members,
    is_running,
    start_process,
    stop_process_group,
)
from hvdflow.infra.services.local import LocalServices
from hvdflow.infra.services.seaweed import recorded_unix_sockets
from tests.cluster.driver import driver_conf, driver_env
from tests.uv import CHECKOUT

BIN = Path(sys.executable).parent
POOL = "hvdflow"
PIPELINE_DEPLOYMENT = "hvdflow-pipeline/hvdflow-pipeline"
SCORE_DEPLOYMENT = "hvdflow-score/hvdflow-score"
SCORES = "s3://hvdflow/scores/soak"
MODEL = "soak"
RAW = "s3://hvdflow/raw/digits/"
DATASETS = "s3://hvdflow/datasets"
IMAGES_PER_CLASS = 50  # 500 digits: epochs long enough to strike in, accuracy far from chance
WORKER_STOP_TIMEOUT_S = 20.0
# Where each Prefect worker keeps its runner's files, one folder per worker, made as it starts
# (prefect.runner.Runner: tempfile.gettempdir()). Prefect 3.8 leaves it behind, empty, even
# when the worker stops cleanly.
RUNNER_STORAGE = Path("/tmp/runner_storage")
WORKER_FOLDER_WAIT_S = 60.0
# What a Prefect worker prints once it runs (its runner's folder, where one is made, is there by
# then), and how long the folder is waited for after it.
WORKER_STARTED = "started!"
WORKER_STARTED_GRACE_S = 2.0
AIRFLOW_ORPHAN_CHECK_S = 30
# The variables that point clients at services: with one set, `hvdflow up` starts none of that
# kind.
SERVICE_VARIABLES = ("AWS_ENDPOINT_URL", "MLFLOW_TRACKING_URI", "PREFECT_API_URL")
# The soak's DAG file: the pipeline registers the soak's model, and each champion it makes is
# scored on the raw images, into the bucket.
AIRFLOW_DAGS = f"""\
from hvdflow.airflow import pipeline_dag, scoring_dag

pipeline_dag(registered_model={MODEL!r})
scoring_dag(registered_model={MODEL!r}, score_input={RAW!r}, score_output={SCORES!r})
"""


@dataclass
class SoakStack:
    cluster: object  # tests.cluster.spark_cluster.NetnsSparkCluster
    workdir: Path
    services: LocalServices = field(init=False)
    env: dict = field(default_factory=dict)  # the clients' variables for the services
    worker: subprocess.Popen | None = None
    workers_started: int = 0
    airflow: object | None = None  # tests.airflow_harness.LocalAirflow, when a run goes through it
    # Hosts lost for good and not replaced yet: their disks went with them (tests.soak.checks).
    lost_for_good: set = field(default_factory=set)
    # Each worker's runner folder (a /tmp entry, "runner_storage/<id>") and what became of the
    # worker: "live", "SIGKILLed" or "stopped"; the soak's checks list these apart.
    worker_folders: dict = field(default_factory=dict)
    _worker_folder: str | None = None
    # The Spark Connect server the runs planned through Connect reach Spark by, once started
    # (hvdflow.infra.services.spark_connect.SparkConnectServer), and what its executors'
    # command lines hold: its driver's address.
    connect: object | None = None
    connect_driver: str | None = None
    # The Spark worker in a container of hvdflow's image (container_kill), while one runs.
    container_worker: str | None = None
    _docker_env: dict | None = None

    def __post_init__(self) -> None:
        self.home = self.workdir / "home"
        self._airflow_starting: Future | None = None
        # Ports of its own, not the conventional ones: a test beside the soak (on the other
        # worker, or in another session) that starts a home on loopback takes those, and
        # SeaweedFS, listening on loopback too, came back from its restart on another port
        # (a clean clone that ran the two profiles' sessions together, 2026-12-01).
        own = {name: free_port(host=self.cluster.driver_ip) for name in ("s3", "mlflow", "prefect")}
        self.services = LocalServices(self.home, ports=own)

    # --- services ---------------------------------------------------------------------------
    def start_services(self) -> dict:
        """Start what is not running (all at first; a killed one later, on its old port)."""
        # Set in this process for its clients; `up` would take them for services of the
        # user's own and start none.
        hidden = {k: os.environ.pop(k) for k in SERVICE_VARIABLES if k in os.environ}
        try:
            env = self.services.up(bind=self.cluster.driver_ip)
        finally:
            os.environ.update(hidden)
        if self.env and env != self.env:
            raise RuntimeError(f"services came back elsewhere: {env} after {self.env}")
        self.env = env
        return env

    def kill_service(self, name: str) -> None:
        """SIGKILL a service's whole process group, as a crash or an OOM kill would."""
        pid = self.services.state()[name]["pid"]
        os.killpg(pid, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while (is_running(pid) or group_members(pid)) and time.monotonic() < deadline:
            time.sleep(0.1)

    def stop_services(self) -> None:
        self.services.down()

    def own_tmp(self) -> tuple[Path, ...]:
        """What in /tmp is the soak's own now: its workdir, and the running S3 server's unix
        sockets (SeaweedFS puts them there; a killed server's go when the next one starts)."""
        return (self.workdir, *recorded_unix_sockets(self.home / "seaweed"))

    # --- the deployment and its worker --------------------------------------------------------
    def worker_env(self) -> dict:
        env = {
            **driver_env(self.cluster, self.workdir / "driver-conf"),
            **self.env,
            "HVDFLOW_HOME": str(self.home),
            "HVDFLOW_CACHE_DIR": str(self.workdir / "cache"),
            "PREFECT_WORKER_QUERY_SECONDS": "2",
            "PYTHONUNBUFFERED": "1",  # the worker's log is what the faults are timed by
        }
        env.pop("PYTHONPATH", None)  # hvdflow as installed, not this checkout's folders
        return env

    def deploy(self, epochs: int) -> str:
        here = self.workdir / "deploy-here"
        here.mkdir(parents=True, exist_ok=True)
        params = {"tracking": {"registered_model_name": MODEL, "experiment": MODEL}}
        done = subprocess.run(
            [str(BIN / "hvdflow"), "deploy", "--pool", POOL, "--np", "2"]
            + ["--epochs", str(epochs), "--params", json.dumps(params)],
            env=self.worker_env(),
            cwd=here,
            capture_output=True,
            text=True,
            timeout=300,
        )
        if done.returncode != 0:
            raise RuntimeError(
                f"hvdflow deploy failed:\n{done.stdout[-2000:]}{done.stderr[-3000:]}"
            )
        return done.stdout

    @property
    def worker_log(self) -> Path:
        return self.workdir / f"worker-{self.workers_started}.log"

    def start_worker(self) -> None:
        here = self.workdir / "worker-here"
        here.mkdir(parents=True, exist_ok=True)
        self.workers_started += 1
        before = _entries(RUNNER_STORAGE)
        self.worker = start_process(
            [str(BIN / "prefect"), "worker", "start", "--pool", POOL],
            self.worker_log,
            self.worker_env(),
            cwd=here,
        )
        self._worker_folder = _new_entry(RUNNER_STORAGE, before, self.worker, self.worker_log)
        if self._worker_folder:
            self.worker_folders[self._worker_folder] = "live"

    def kill_worker(self) -> None:
        """SIGKILL the worker alone (the flow runs it started are left to themselves)."""
        self.worker.send_signal(signal.SIGKILL)
        self.worker.wait(10)
        self._worker_ended("SIGKILLed")

    def stop_worker(self) -> None:
        if self.worker is not None:
            stop_process_group(self.worker, WORKER_STOP_TIMEOUT_S)
            self._worker_ended("stopped")

    def remove_worker_folders(self) -> None:
        """Remove the empty runner folders of the workers that ended (once the checks have
        listed them): Prefect leaves one per worker, even one that stopped cleanly, and
        nothing else would remove them."""
        for entry, how in self.worker_folders.items():
            if how != "live":
                with contextlib.suppress(OSError):  # gone already, or not empty: left as is
                    (RUNNER_STORAGE.parent / entry).rmdir()

    def _worker_ended(self, how: str) -> None:
        if self._worker_folder:
            self.worker_folders[self._worker_folder] = how
            self._worker_folder = None

    # --- Airflow ------------------------------------------------------------------------------
    def start_airflow(self) -> None:
        """Airflow with the pipeline and scoring DAGs for the soak's model, its tasks run by
        this environment's Python against the cluster and the services, as docs/airflow.md sets
        a user's Airflow up."""
        from tests.airflow_harness import Airflow

        env = {
            **self.worker_env(),
            "HVDFLOW_PYTHON": sys.executable,
            # The tasks of a dead scheduler are reset, and so run again, at the new scheduler's
            # next look for orphans: every 30 s here, not Airflow's default five minutes.
            "AIRFLOW__SCHEDULER__ORPHANED_TASKS_CHECK_INTERVAL": str(AIRFLOW_ORPHAN_CHECK_S),
        }
        self.airflow = Airflow(self.workdir / "airflow", env)
        self.airflow.dags_folder.mkdir(parents=True, exist_ok=True)
        (self.airflow.dags_folder / "hvdflow_soak.py").write_text(AIRFLOW_DAGS)
        self.airflow.start()
        for dag_id in ("hvdflow_pipeline", "hvdflow_score"):
            self.airflow.wait_for_dag(dag_id)

    def start_airflow_soon(self) -> None:
        """Start Airflow in the background (about a minute), while the first runs go through
        Prefect; ``wait_for_airflow`` before asking it for a run."""
        self._airflow_starting = ThreadPoolExecutor(1).submit(self.start_airflow)

    def wait_for_airflow(self) -> None:
        if self._airflow_starting is not None:
            self._airflow_starting.result()

    def stop_airflow(self) -> list[str]:
        """Stop Airflow; what of it is left running (should be nothing)."""
        if self._airflow_starting is not None:
            with contextlib.suppress(Exception):  # its failure was said where it was waited for
                self._airflow_starting.result()
        if self.airflow is None:
            return []
        return self.airflow.stop()

    # --- Spark Connect ------------------------------------------------------------------------
    def start_connect(self) -> str:
        """A Spark Connect server at the driver's address over the cluster's master, as an
        operator runs one for thin clients; its URL. Its application holds every core while it
        runs (tests.soak.plan: the runs through it come last, one at a time)."""
        from hvdflow.infra.ports import unclaimed_port
        from hvdflow.infra.services.spark_connect import SparkConnectServer

        ip = self.cluster.driver_ip
        grpc = unclaimed_port(ip)
        port = next(p for p in iter(lambda: unclaimed_port(ip), None) if p != grpc)
        conf = {**driver_conf(self.cluster), "spark.sql.shuffle.partitions": "2"}
        for key in ("spark.driver.host", "spark.driver.bindAddress"):
            conf.pop(key)  # the server sets both to its own address
        # A fixed driver port: its executors' command lines name it, which tells them apart
        # from a run's own (tests.soak.checks.leftover_processes). No retry on another port,
        # which they would name instead: a port taken meanwhile fails the start, and says so.
        conf |= {"spark.driver.port": str(port), "spark.port.maxRetries": "0"}
        server = SparkConnectServer(
            self.workdir / "connect", grpc, host=ip, master=self.cluster.master_url, conf=conf
        )
        self.connect = server.start()
        self.connect_driver = f"CoarseGrainedScheduler@{ip}:{port}"
        return self.connect.url

    def stop_connect(self) -> None:
        """Stop the Connect server; its executors end with it (the next check looks)."""
        if self.connect is not None:
            self.connect.stop()
            self.connect, self.connect_driver = None, None

    def connect_alive(self) -> bool:
        return self.connect is not None and is_running(self.connect.pid)

    def connect_pids(self) -> set[int]:
        """The live Connect server's processes: its own group, and its executors on the hosts.
        They live as long as the server, not as long as a run."""
        if self.connect is None or self.connect.pid is None:
            return set()
        from tests.soak.faults import EXECUTOR_MAIN, in_hosts

        executors = {p.pid for p in in_hosts(self, EXECUTOR_MAIN) if _names(p, self.connect_driver)}
        return executors | set(group_members(self.connect.pid)) | {self.connect.pid}

    # --- a worker in a container (container_kill) ----------------------------------------------
    def docker(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        """``docker args`` on the engine scripts/docker.sh finds or starts."""
        if self._docker_env is None:
            found = subprocess.run(
                ["bash", "-c", "source scripts/docker.sh && docker_engine && echo $DOCKER_HOST"],
                cwd=CHECKOUT, capture_output=True, text=True, timeout=120, check=True,
            )  # fmt: skip
            self._docker_env = os.environ | {"DOCKER_HOST": found.stdout.split()[-1]}
        return subprocess.run(
            ["docker", *args], env=self._docker_env, capture_output=True, text=True,
            timeout=300, check=check,
        )  # fmt: skip

    def start_container_worker(self) -> None:
        """A third Spark worker, in a container of the classic image (built from this checkout,
        from the engine's cache when unchanged) on the host's network: on the driver's address,
        the one the hosts reach, under a host name of its own. The executors' Python is the
        image's: the driver names its own (sys.executable), so that path runs the image's."""
        if self.container_worker is not None:
            return
        self.docker("version")  # the engine, first
        built = subprocess.run(
            ["bash", "scripts/image.sh", "classic"], cwd=CHECKOUT, env=self._docker_env,
            capture_output=True, text=True, timeout=1800,
        )  # fmt: skip
        if built.returncode != 0:
            raise RuntimeError(f"the image did not build: {built.stderr[-2000:]}")
        tag = built.stdout.split()[-1]
        python = self.workdir / "image-python"
        python.write_text('#!/bin/sh\nexec /opt/hvdflow/bin/python "$@"\n')
        python.chmod(0o755)
        name, ip = f"hvdc{self.cluster.tag}-ctr", self.cluster.driver_ip
        self.cluster.extra_worker_ips.add(ip)
        self.docker(
            "run", "-d", "--name", name, "--hostname", name, "--add-host", f"{name}:{ip}",
            "--network", "host", "-e", f"SPARK_LOCAL_IP={ip}",
            "-v", f"{python}:{sys.executable}:ro", tag, "spark-class",
            "org.apache.spark.deploy.worker.Worker", "--host", ip, "--cores", "1",
            "--memory", self.cluster.memory, "--webui-port", "0", self.cluster.master_url,
        )  # fmt: skip
        self.container_worker = name
        self.wait_for_container_worker()

    def wait_for_container_worker(self, timeout_s: float = 90.0) -> None:
        deadline = time.monotonic() + timeout_s
        while self.cluster.driver_ip not in {w["host"] for w in self.cluster.alive_workers()}:
            if time.monotonic() > deadline:
                log = self.docker("logs", "--tail", "20", self.container_worker, check=False)
                raise RuntimeError(f"the container's worker did not register:\n{log.stderr}")
            time.sleep(0.5)

    def remove_container_worker(self) -> None:
        if self.container_worker is not None:
            self.docker("rm", "-f", self.container_worker, check=False)
            self.container_worker = None
            self.cluster.extra_worker_ips.discard(self.cluster.driver_ip)

    # --- data ---------------------------------------------------------------------------------
    def store(self):
        from hvdflow.infra.storage.object_store import ObjectStore, ObjectStoreConfig

        return ObjectStore(ObjectStoreConfig.from_env(bucket="hvdflow"))

    def upload_digits(self, per_class: int = IMAGES_PER_CLASS, start: int = 0) -> int:
        """Real digits (PNG) into the raw tree, ``per_class`` of each class from the
        ``start``-th on; returns how many."""
        from PIL import Image

        from hvdflow.training.digits import bundled_digits

        store, (images, labels) = self.store(), bundled_digits()
        counts: dict[int, int] = {}
        put = 0
        for i, (image, label) in enumerate(zip(images, labels, strict=True)):
            seen = counts.get(label, 0)
            counts[label] = seen + 1
            if not start <= seen < start + per_class:
                continue
            buffer = io.BytesIO()
            Image.fromarray((image * 255 / 16).astype("uint8"), mode="L").save(buffer, "PNG")
            store.put_bytes(buffer.getvalue(), f"{RAW}{label}/digit_{i:04d}.png", "image/png")
            put += 1
        return put


def processes_with_env(name: str, value: str) -> list[psutil.Process]:
    found = []
    for proc in psutil.process_iter():
        try:
            if proc.status() != psutil.STATUS_ZOMBIE and proc.environ().get(name) == value:
                found.append(proc)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return found


def _names(proc: psutil.Process, text: str) -> bool:
    try:
        return text in " ".join(proc.cmdline())
    except psutil.Error:
        return False


def _entries(folder: Path) -> set[str]:
    with contextlib.suppress(OSError):
        return set(os.listdir(folder))
    return set()


def _new_entry(
    folder: Path,
    before: set[str],
    worker: subprocess.Popen,
    log: Path,
    under: Path = Path("/tmp"),
) -> str | None:
    """The entry of ``under`` ("runner_storage/<id>") of the worker just started: the folder
    that appears in ``folder`` as its runner starts, before the worker says it started. None
    when none appears by then (Prefect 3.9's process worker makes none: it waited the whole
    WORKER_FOLDER_WAIT_S, a minute, at each start) or while it runs (a worker that failed to
    start says why in its log, which the soak's runs then show)."""
    deadline = time.monotonic() + WORKER_FOLDER_WAIT_S
    while time.monotonic() < deadline and worker.poll() is None:
        new = _entries(folder) - before
        if new:
            return f"{folder.relative_to(under)}/{min(new)}"
        if WORKER_STARTED in _text(log):
            deadline = min(deadline, time.monotonic() + WORKER_STARTED_GRACE_S)
        time.sleep(0.2)
    return None


def _text(path: Path) -> str:
    with contextlib.suppress(OSError):
        return path.read_text(errors="replace")
    return ""
