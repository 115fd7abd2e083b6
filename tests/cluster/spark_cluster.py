"""A Spark standalone cluster on simulated hosts: the master beside the driver, a worker per host.

Started from pyspark's own ``spark-class``, as on real machines: the master in the root
namespace on the bridge address, each worker inside its host (its namespaces, its address,
its /tmp as work and local dirs). Spark is told addresses, never hostnames, so the driver does
not have to resolve the hosts' names.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import psutil
import pyspark

from hvdflow.infra.ports import unclaimed_port
from tests.cluster import cleanup, netns, processes, registry
from tests.cluster.netns import Host
from tests.helpers import TEST_SESSION_VAR

logger = logging.getLogger(__name__)

SPARK_HOME = Path(pyspark.__file__).parent
MASTER = "org.apache.spark.deploy.master.Master"
WORKER = "org.apache.spark.deploy.worker.Worker"
EXECUTOR = "org.apache.spark.executor.CoarseGrainedExecutorBackend"
# A worker's web UI lives in its own namespace, so every worker can use Spark's default port.
WORKER_WEBUI_PORT = 8081


@dataclass
class NetnsSparkCluster:
    """A running cluster: where it is, and how to act on its hosts."""

    master_url: str
    webui_url: str
    driver_ip: str
    hosts: tuple[Host, ...]  # the hosts started with a worker
    workdir: Path
    tag: str
    cores: int = 1  # each worker's
    memory: str = "2g"
    spare_hosts: tuple[Host, ...] = ()  # up, on the network, with no worker until started
    anchors: dict[str, int] = field(default_factory=dict)  # host name -> anchor pid
    netns_inodes: dict[str, int] = field(default_factory=dict)  # netns -> inode
    # Workers that are not the hosts' (the soak's worker in a container), by address.
    extra_worker_ips: set[str] = field(default_factory=set)
    _procs: list[subprocess.Popen] = field(default_factory=list, repr=False)

    def host(self, which: Host | str) -> Host:
        name = which.name if isinstance(which, Host) else which
        every = self.hosts + self.spare_hosts
        for host in every:
            if name in (host.name, host.ip, host.netns):
                return host
        raise ValueError(f"host {which!r}: expected one of {[h.name for h in every]}")

    def start_worker(self, host: Host | str, timeout_s: float = 120.0) -> None:
        """Start a worker on ``host`` (a spare one, or one whose worker was stopped) and wait
        until the master counts it."""
        host = self.host(host)
        # A stopped worker's process has exited; it is not a failed start.
        self._procs[:] = [p for p in self._procs if p.poll() is None]
        self._procs.append(_start_worker(self, host, self.cores, self.memory))
        _wait_for_workers(self, (host,), timeout_s)

    def stop_host_for_good(self, host: Host | str) -> list[int]:
        """SIGKILL every process of ``host`` (its worker, executor, ranks) but its anchor, as a
        machine that dies does; returns their pids. Nothing restarts them."""
        host = self.host(host)
        inode, anchor = self.netns_inodes[host.netns], self.anchors[host.name]
        killed = []
        for proc in psutil.process_iter():
            try:
                if proc.pid != anchor and _net_inode(proc.pid) == inode:
                    proc.kill()
                    killed.append(proc.pid)
            except psutil.Error:
                continue
        return killed

    def host_processes(self, host: Host | str, marker: str) -> list[psutil.Process]:
        """The live processes of ``host`` whose command line holds ``marker`` (e.g. ``WORKER``,
        ``EXECUTOR``)."""
        inode = self.netns_inodes[self.host(host).netns]
        found = []
        for proc in psutil.process_iter(["cmdline"]):
            try:
                if marker in " ".join(proc.info["cmdline"] or []) and _net_inode(proc.pid) == inode:
                    found.append(proc)
            except psutil.Error:
                continue
        return found

    def run_on_host(
        self, host: Host | str, command: str | Sequence[str], *, timeout_s: float = 30.0
    ) -> subprocess.CompletedProcess:
        """Run ``command`` on ``host`` (its network, disk and hostname), bounded."""
        return netns.run_on_host(self.anchors[self.host(host).name], command, timeout_s=timeout_s)

    def shell_command(self, host: Host | str) -> list[str]:
        """The argv of an interactive shell on ``host`` (for people)."""
        return netns.enter(self.anchors[self.host(host).name]) + [
            "env",
            f"HOME={netns.HOST_HOME}",
            "bash",
        ]

    def cut_link(self, host: Host | str) -> None:
        """Unplug ``host``'s network cable; its processes keep running."""
        netns.set_link(self.host(host), up=False)

    def restore_link(self, host: Host | str) -> None:
        netns.set_link(self.host(host), up=True)

    def processes(self) -> list[psutil.Process]:
        """Every live process of the cluster: the master, and all inside the hosts."""
        own = {p.pid for p in self._procs if p.poll() is None}
        found = []
        for proc in psutil.process_iter():
            try:
                if proc.pid in own or _net_inode(proc.pid) in self.netns_inodes.values():
                    found.append(proc)
            except psutil.Error:
                continue
        return found

    def alive_workers(self) -> list[dict]:
        """The master's view of its live workers (host, cores, ...); [] if it does not answer."""
        try:
            with urllib.request.urlopen(self.webui_url + "/json/", timeout=2) as r:
                workers = json.load(r).get("workers", [])
        except (OSError, ValueError):
            return []
        return [w for w in workers if w.get("state") == "ALIVE"]

    def diagnostics(self, lines: int = 30) -> str:
        """The tails of the master's and workers' logs, and of each host's executor logs."""
        parts = []
        for log in sorted(self.workdir.glob("*.log")):
            tail = log.read_text(errors="replace").splitlines()[-lines:]
            parts.append(f"--- {log.name}\n" + "\n".join(tail))
        for host in self.hosts:
            try:
                done = self.run_on_host(
                    host,
                    f"for f in {netns.HOST_WORK_DIR}/*/*/stderr; do "
                    f'[ -f "$f" ] && echo "--- $f" && tail -n {lines} "$f"; done',
                    timeout_s=10,
                )
            except (KeyError, OSError, subprocess.SubprocessError) as e:  # host not up, or gone
                parts.append(f"--- executors on {host.name}: cannot read ({e!r})")
                continue
            parts.append(f"--- executors on {host.name}\n{done.stdout}")
        return "\n".join(parts)


@contextmanager
def netns_spark_cluster(
    workdir: Path | str,
    workers: int = 2,
    cores: int = 1,
    memory: str = "2g",
    timeout_s: float = 90.0,
    kind: str = "pytest",
    spare: int = 0,
) -> Iterator[NetnsSparkCluster]:
    """Start a master and ``workers`` one-host workers; remove every trace on the way out.

    ``timeout_s`` bounds the start (namespaces, JVMs, registration). ``kind`` tells ``down``
    whether it may stop this run while its owner lives ("up") or not ("pytest"). ``spare``
    hosts more are on the network with no worker, for a test to start one on (a host that
    joins), at no cost until then.
    """
    if workers < 1 or cores < 1 or spare < 0:
        raise ValueError(
            f"workers={workers}, cores={cores}, spare={spare}: expected at least 1 worker and "
            "core, and no negative spare"
        )
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    record = registry.claim(kind)
    net = netns.layout(record.tag, record.subnet, workers + spare)
    watchdog = None
    cluster = NetnsSparkCluster(
        master_url="",
        webui_url="",
        driver_ip=net.driver_ip,
        hosts=net.hosts[:workers],
        workdir=workdir,
        tag=net.tag,
        cores=cores,
        memory=memory,
        spare_hosts=net.hosts[workers:],
    )
    try:
        watchdog = cleanup.start_watchdog(record, workdir / "watchdog.log")
        netns.create(net)
        for host in net.hosts:
            anchor = netns.start_host(host, workdir / f"{host.name}-anchor.log")
            cluster._procs.append(anchor)
            cluster.anchors[host.name] = anchor.pid
            cluster.netns_inodes[host.netns] = netns.netns_inode(host.netns)
        _start_master(cluster, record)
        for host in cluster.hosts:
            cluster._procs.append(_start_worker(cluster, host, cores, memory))
        _wait_for_workers(cluster, cluster.hosts, timeout_s)
        logger.info("netns Spark cluster %s up: %s", cluster.tag, cluster.master_url)
        yield cluster
    finally:
        _teardown(cluster, record, watchdog)


def _start_master(cluster: NetnsSparkCluster, record: registry.RunRecord) -> None:
    port, webui = _free_port(cluster.driver_ip), _free_port(cluster.driver_ip)
    env = {
        **_spark_env(),
        "SPARK_LOCAL_IP": cluster.driver_ip,
        "SPARK_LOCAL_DIRS": str(cluster.workdir / "master-local"),
    }
    master = processes.start(
        [_spark_class(), MASTER, "--host", cluster.driver_ip]
        + ["--port", str(port), "--webui-port", str(webui)],
        log=cluster.workdir / "master.log",
        env=env,
    )
    cluster._procs.append(master)
    cluster.master_url = f"spark://{cluster.driver_ip}:{port}"
    cluster.webui_url = f"http://{cluster.driver_ip}:{webui}"
    record.pids["master"] = list(processes.identity(master.pid) or (master.pid, 0.0))
    record.save()  # so that `down` finds the master if this process dies


def _start_worker(cluster: NetnsSparkCluster, host: Host, cores: int, memory: str):
    # A host's own environment, as on a fresh machine: nothing of the driver's is forwarded.
    env = netns.host_env(
        {
            "SPARK_HOME": str(SPARK_HOME),
            "SPARK_LOCAL_IP": host.ip,
            "SPARK_LOCAL_DIRS": netns.HOST_LOCAL_DIRS,
            # Executors run the project's interpreter (on the shared disk, as a shared install).
            "PYSPARK_PYTHON": sys.executable,
            # The only thing of the driver's a host gets: which test session its ranks belong
            # to, so the leak checks (tests.helpers.rank_processes) count this session's alone.
            **{k: os.environ[k] for k in (TEST_SESSION_VAR,) if k in os.environ},
        }
    )
    return processes.start(
        netns.enter(cluster.anchors[host.name])
        + [_spark_class(), WORKER, "--host", host.ip, "--cores", str(cores)]
        + ["--memory", memory, "--webui-port", str(WORKER_WEBUI_PORT)]
        + ["--work-dir", netns.HOST_WORK_DIR, cluster.master_url],
        log=cluster.workdir / f"{host.name}-worker.log",
        env=env,
    )


def _wait_for_workers(cluster: NetnsSparkCluster, hosts: Sequence[Host], timeout_s: float) -> None:
    """Wait until the master counts a live worker on each of ``hosts``."""
    deadline = time.monotonic() + timeout_s
    wanted = {h.ip for h in hosts}
    while not wanted <= (alive := {w["host"] for w in cluster.alive_workers()}):
        dead = [p.args for p in cluster._procs if p.poll() is not None]
        if dead or time.monotonic() > deadline:
            why = f"a process exited ({dead[0]})" if dead else f"not within {timeout_s:g} s"
            raise RuntimeError(
                f"netns Spark cluster: {len(wanted & alive)} of {len(wanted)} workers "
                f"registered with {cluster.master_url}, {why} (netns_spark_cluster "
                "timeout_s):\n" + cluster.diagnostics()
            )
        time.sleep(0.5)
    known = {h.ip for h in cluster.hosts + cluster.spare_hosts} | cluster.extra_worker_ips
    if not alive <= known:
        raise RuntimeError(
            f"workers registered from {sorted(alive)}, expected the hosts' addresses"
        )


def _teardown(cluster: NetnsSparkCluster, record: registry.RunRecord, watchdog) -> None:
    """Stop workers first (they stop their executors), then whatever is left, then the network."""
    anchors = set(cluster.anchors.values())
    processes.stop_groups([p for p in cluster._procs if p.pid not in anchors])
    problems = cleanup.remove_run(record)  # kills what is left in the hosts, removes the names
    processes.stop_groups(p for p in cluster._procs if p.pid in anchors)  # reaps them
    processes.stop_groups([watchdog], grace_s=2)
    if problems:
        logger.error(
            "netns cluster %s: could not remove %s; run `python -m tests.cluster down`",
            cluster.tag,
            "; ".join(problems),
        )


def _spark_env() -> dict[str, str]:
    # The driver's own Spark settings (conf dir, submit args) must not leak into the daemons.
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SPARK_", "PYSPARK_"))}
    return {**env, "SPARK_HOME": str(SPARK_HOME)}


def _spark_class() -> str:
    return str(SPARK_HOME / "bin" / "spark-class")


def _free_port(address: str) -> int:
    # Below the ephemeral range, as the product picks its servers' ports: a port from bind(0)
    # may go to an outgoing connection before the JVM binds it, and Spark then moves to the
    # next port, where the workers do not look for it.
    return unclaimed_port(address)


def _net_inode(pid: int) -> int | None:
    try:
        return int(os.readlink(f"/proc/{pid}/ns/net").split("[")[1].rstrip("]"))
    except (OSError, IndexError, ValueError):
        return None
