"""HorovodRunner under real faults on separate hosts: a rank killed, a host's cable cut.

Each test runs a driver (``run_driver``) whose two ranks, one per host, allreduce in a loop until
stopped; the test injects the fault once both ranks passed ``hvd.init()``, then checks what the
user sees (the driver's error, naming the rank and its host, and when it came) and that no rank
process is left on any host. Rank processes run inside the hosts' namespaces but are visible
from here, the root namespace.
"""

from __future__ import annotations

import json
import os
import signal
import textwrap
import threading
import time
from pathlib import Path

import psutil
import pytest

from tests.cluster.driver import DriverRun, run_driver
from tests.cluster.spark_cluster import MASTER as MASTER_MAIN
from tests.cluster.spark_cluster import WORKER as WORKER_MAIN
from tests.cluster.spark_cluster import NetnsSparkCluster
from tests.helpers import rank_of

pytestmark = pytest.mark.slow

# Bounds the ranks' start: two TensorFlow imports and hvd.init() on two busy cores.
READY_WITHIN_S = 180.0
# The heartbeat timeout the cut-link run uses, and the slack allowed on top of it.
HEARTBEAT_TIMEOUT_S = 15.0
MARGIN_S = 15.0

# argv: the file each rank's "READY" line is noted in (by the driver), heartbeat_timeout_s.
# Prints FAILED_AT=<wall time> and ERROR=<json message> when the run fails as expected.
FAULT_DRIVER = textwrap.dedent(
    """
    import json, sys, time
    from hvdflow import HorovodRunner, LaunchOptions, RankFailed

    ready_file, heartbeat_timeout_s = sys.argv[1], float(sys.argv[2])

    def note_ready(line):
        if line.text.startswith("READY"):
            with open(ready_file, "a") as f:
                f.write(f"{line.rank}\\n")

    def main():
        import horovod.tensorflow as hvd
        import tensorflow as tf

        hvd.init()
        print(f"READY rank {hvd.rank()}", flush=True)
        while True:  # a training loop: a collective, a pause
            hvd.allreduce(tf.constant(1.0))
            time.sleep(0.2)

    runner = HorovodRunner(
        np=2,
        options=LaunchOptions(
            slot_wait_s=90,
            start_timeout_s=150,
            heartbeat_timeout_s=heartbeat_timeout_s,
            timeout_s=400,
            on_log_line=note_ready,
        ),
    )
    try:
        runner.run(main)
    except RankFailed as e:
        print(f"FAILED_AT={time.time()}", flush=True)
        print("ERROR=" + json.dumps(str(e)), flush=True)
        sys.exit(3)
    """
)


class DriverInBackground:
    """``run_driver`` on a thread, so the test can act on the cluster while the run goes on."""

    def __init__(self, cluster: NetnsSparkCluster, workdir: Path, heartbeat_timeout_s: float):
        self.ready_file = workdir / "ready"
        self.run: DriverRun | None = None
        self.error: BaseException | None = None
        args = ("-c", FAULT_DRIVER, str(self.ready_file), str(heartbeat_timeout_s))
        self._thread = threading.Thread(
            target=self._main, args=(cluster, args, workdir), daemon=True
        )
        self._thread.start()

    def _main(self, cluster, args, workdir) -> None:
        try:
            self.run = run_driver(cluster, *args, workdir=workdir, timeout_s=480)
        except BaseException as e:  # reported by finish()
            self.error = e

    def wait_ready(self, cluster: NetnsSparkCluster) -> None:
        deadline = time.monotonic() + READY_WITHIN_S
        while not (self.ready_file.exists() and len(self.ready_file.read_text().split()) == 2):
            assert self._thread.is_alive(), f"the driver ended early:\n{self.finish()}"
            assert time.monotonic() < deadline, (
                f"the ranks did not both print READY within {READY_WITHIN_S:g} s\n"
                + cluster.diagnostics()
            )
            time.sleep(0.5)

    def finish(self, timeout_s: float = 500) -> DriverRun:
        self._thread.join(timeout_s)
        assert not self._thread.is_alive(), "run_driver did not return"
        if self.error is not None:
            raise self.error
        return self.run


def cluster_ranks(cluster: NetnsSparkCluster) -> dict[psutil.Process, tuple[str, str]]:
    """The live rank processes on the cluster's hosts: process -> (its rank, its host's
    address). A rank forked from its task shows the task's environment in /proc: its rank is in
    the name it gives itself, its host is the network namespace it runs in."""
    address_of = {cluster.netns_inodes[host.netns]: host.ip for host in cluster.hosts}
    found = {}
    for proc in cluster.processes():
        try:
            rank = rank_of(proc)
            if rank is not None:
                found[proc] = (
                    str(rank),
                    address_of.get(os.stat(f"/proc/{proc.pid}/ns/net").st_ino),
                )
        except (psutil.Error, OSError):  # gone meanwhile, or a zombie
            continue
    return found


def wait_for_no_cluster_ranks(cluster: NetnsSparkCluster, until: float) -> list[str]:
    """Wait until no rank process is left on any host, or ``until`` (monotonic)."""
    while (left := cluster_ranks(cluster)) and time.monotonic() < until:
        time.sleep(0.2)
    return [f"rank {rank} pid {p.pid} on {addr}" for p, (rank, addr) in left.items()]


def wait_for_no_run_processes(cluster: NetnsSparkCluster, until: float) -> list[str]:
    """Wait until the hosts run nothing of the run (its executors, their Python workers, its
    ranks): only each host's anchor and Spark worker daemon stay."""

    def leftovers() -> list[str]:
        found = []
        for proc in cluster.processes():
            try:
                cmdline = proc.cmdline()
            except psutil.Error:  # gone meanwhile, or a zombie
                continue
            daemon = WORKER_MAIN in cmdline or MASTER_MAIN in cmdline
            if not daemon and proc.pid not in cluster.anchors.values():
                found.append(f"{proc.pid} {' '.join(cmdline)[:200]}")
        return found

    while (left := leftovers()) and time.monotonic() < until:
        time.sleep(0.5)
    return left


def failure_of(run: DriverRun) -> tuple[float, str]:
    """(the wall time the driver raised RankFailed, its message)."""
    lines = run.stdout.splitlines()
    failed_at = next((ln for ln in lines if ln.startswith("FAILED_AT=")), None)
    error = next((ln for ln in lines if ln.startswith("ERROR=")), None)
    assert run.returncode == 3 and failed_at and error, (
        f"rc={run.returncode}\n{run.stdout[-3000:]}\n{run.stderr[-5000:]}"
    )
    return float(failed_at.removeprefix("FAILED_AT=")), json.loads(error.removeprefix("ERROR="))


@pytest.mark.timeout(600)  # includes the session cluster's start, if this test is the first
def test_a_sigkilled_rank_is_named_with_its_host_within_seconds_and_nothing_is_left(
    netns_cluster, tmp_path
):
    driver = DriverInBackground(netns_cluster, tmp_path, heartbeat_timeout_s=60)
    try:
        driver.wait_ready(netns_cluster)
        ranks = cluster_ranks(netns_cluster)
        assert sorted(r for r, _ in ranks.values()) == ["0", "1"], ranks
        [(victim, address)] = [(p, addr) for p, (r, addr) in ranks.items() if r == "1"]
        host = netns_cluster.host(address)
        victim.send_signal(signal.SIGKILL)
        killed_at = time.time()
        failed_at, message = failure_of(driver.finish())
    finally:
        for proc in cluster_ranks(netns_cluster):  # only if the test failed before its kill
            proc.kill()

    print(f"error {failed_at - killed_at:.1f} s after the kill:\n{message}")
    assert message.startswith(
        f"HorovodRunner np=2: rank 1 on {host.name} ({host.ip}) was killed by SIGKILL (exit -9)"
    ), message
    # Well inside the 60 s heartbeat timeout: the kill itself was reported, not the silence.
    # (About 1 s when the machine is quiet; the bound leaves room for stopping the Spark job.)
    assert failed_at - killed_at < 20.0, f"the error came {failed_at - killed_at:.1f} s after"
    assert "[1,1]<stdout>:READY rank 1" in message  # the tail of the killed rank's output
    assert wait_for_no_cluster_ranks(netns_cluster, time.monotonic() + 10) == []
    # Nor anything else of the run, once its driver is gone: executors and their workers too.
    assert wait_for_no_run_processes(netns_cluster, time.monotonic() + 30) == []


@pytest.mark.timeout(600)
def test_a_host_cut_off_mid_run_is_named_within_the_heartbeat_timeout_and_keeps_no_rank(
    netns_cluster, tmp_path
):
    driver = DriverInBackground(netns_cluster, tmp_path, heartbeat_timeout_s=HEARTBEAT_TIMEOUT_S)
    driver.wait_ready(netns_cluster)
    ranks = cluster_ranks(netns_cluster)
    assert sorted(r for r, _ in ranks.values()) == ["0", "1"], ranks
    host = netns_cluster.hosts[1]
    [cut_rank] = [r for r, addr in ranks.values() if addr == host.ip]
    netns_cluster.cut_link(host)
    cut_at, cut_mono = time.time(), time.monotonic()
    try:
        failed_at, message = failure_of(driver.finish())
        # The cut-off host hears nothing either: its task kills its rank once the timeout passes.
        left = wait_for_no_cluster_ranks(netns_cluster, cut_mono + HEARTBEAT_TIMEOUT_S + MARGIN_S)
        print(f"no rank left on any host {time.monotonic() - cut_mono:.1f} s after the cut")
    finally:
        netns_cluster.restore_link(host)
        for proc in cluster_ranks(netns_cluster):  # only if the test failed
            proc.kill()

    print(f"error {failed_at - cut_at:.1f} s after the cut:\n{message}")
    assert message.startswith(
        f"HorovodRunner np=2: rank {cut_rank} on {host.name} ({host.ip}) stopped answering: the "
        f"driver heard nothing from it for {HEARTBEAT_TIMEOUT_S:g} s (HorovodRunner "
        "heartbeat_timeout_s). Its host may be unreachable or frozen"
    ), message
    took = failed_at - cut_at
    assert HEARTBEAT_TIMEOUT_S - 3 < took < HEARTBEAT_TIMEOUT_S + MARGIN_S, f"after {took:.1f} s"
    # The driver's own record of the rank's output stands in for the report it could not send.
    assert f"[1,{cut_rank}]<stdout>:READY rank {cut_rank}" in message
    assert left == []
    assert wait_for_no_run_processes(netns_cluster, time.monotonic() + 60) == []
