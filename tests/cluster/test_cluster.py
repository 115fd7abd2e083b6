"""The multi-host harness: separate hosts, Horovod across them, and nothing left afterwards."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import uuid

import psutil
import pytest

from tests.cluster import cleanup, netns, registry
from tests.cluster.driver import run_driver
from tests.cluster.fixtures import require_harness
from tests.cluster.spark_cluster import netns_spark_cluster
from tests.helpers import wait_for_no_ranks

pytestmark = pytest.mark.slow

# A client that connects to HOST:PORT within 3 s and says where from; exit 1 if it cannot.
CONNECT = textwrap.dedent(
    """
    import socket, sys
    try:
        c = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=3)
    except OSError as e:
        sys.exit(f"cannot connect: {e}")
    print(c.getsockname()[0])
    """
)

# What a host says it is: its hostname, what that resolves to there, and its HOME.
WHO_AM_I = (
    "import os, socket; n = socket.gethostname(); "
    "print(n, socket.gethostbyname(n), os.environ['HOME'])"
)


def _listener(address: str) -> socket.socket:
    server = socket.socket()
    server.bind((address, 0))
    server.listen()
    server.settimeout(10)
    return server


@pytest.mark.timeout(200)  # includes the session cluster's start (START_TIMEOUT_S)
def test_hosts_have_their_own_disk_name_and_address(netns_cluster):
    host1, host2 = netns_cluster.hosts
    assert sorted(w["host"] for w in netns_cluster.alive_workers()) == [host1.ip, host2.ip]

    marker = f"/tmp/hvdc-probe-{uuid.uuid4().hex}"
    wrote = netns_cluster.run_on_host(host1, f"echo from-host1 > {marker} && cat {marker}")
    assert (wrote.returncode, wrote.stdout) == (0, "from-host1\n"), wrote.stderr
    assert netns_cluster.run_on_host(host2, f"test -e {marker}").returncode == 1
    assert not os.path.exists(marker)  # the driver's /tmp

    for host in (host1, host2):
        done = netns_cluster.run_on_host(host, [sys.executable, "-c", WHO_AM_I])
        assert done.stdout.split() == [host.name, host.ip, netns.HOST_HOME], done.stderr
        # Only the harness's /24 is reachable: no default route out of a host.
        routes = netns_cluster.run_on_host(host, "ip -4 route").stdout.splitlines()
        assert routes and all(
            r.startswith(netns_cluster.driver_ip.rsplit(".", 1)[0]) for r in routes
        )

    with _listener(netns_cluster.driver_ip) as server:
        port = str(server.getsockname()[1])
        done = netns_cluster.run_on_host(
            host1, [sys.executable, "-c", CONNECT, netns_cluster.driver_ip, port]
        )
        assert (done.returncode, done.stdout.strip()) == (0, host1.ip), done.stderr
        conn, (peer, _port) = server.accept()
        conn.close()
        assert peer == host1.ip


@pytest.mark.timeout(60)
def test_a_cut_link_stops_a_hosts_traffic_until_restored(netns_cluster):
    host = netns_cluster.hosts[1]
    with _listener(netns_cluster.driver_ip) as server:
        connect = [
            sys.executable,
            "-c",
            CONNECT,
            netns_cluster.driver_ip,
            str(server.getsockname()[1]),
        ]
        netns_cluster.cut_link(host)
        try:
            cut = netns_cluster.run_on_host(host, connect)
        finally:
            netns_cluster.restore_link(host)
        assert cut.returncode == 1 and "cannot connect" in cut.stderr
        restored = netns_cluster.run_on_host(host, connect)
        assert restored.returncode == 0, restored.stderr


@pytest.mark.timeout(300)
def test_hvdflow_smoke_np2_runs_one_rank_on_each_host_with_identical_weights(
    netns_cluster, tmp_path
):
    """``hvdflow smoke`` as a user runs it against a standalone cluster (HVDFLOW_SPARK_MASTER
    and spark-defaults.conf in SPARK_CONF_DIR): Horovod np=2, one rank on each host, each on
    its host's own address and interface, ending with the same weights."""
    run = run_driver(
        netns_cluster,
        *("-m", "hvdflow.flows.cli", "smoke", "--np", "2", "--epochs", "1"),
        workdir=tmp_path,
        timeout_s=240,
    )
    assert run.returncode == 0, f"{run.stderr[-4000:]}\n--- cluster:\n{netns_cluster.diagnostics()}"
    result = json.loads(run.stdout[run.stdout.index("{") :])
    assert result["size"] == 2 and result["identical_weights"] is True
    assert len(result["checksums"]) == 2 and len(set(result["checksums"])) == 1
    host1, host2 = netns_cluster.hosts
    where = sorted((r["host"], r["address"], r["interface"]) for r in result["ranks"])
    assert where == [(host1.name, host1.ip, "eth0"), (host2.name, host2.ip, "eth0")]
    assert "[1,1]<stdout>:rank 1 of 2 joined on " in run.stderr  # rank 1, tagged
    assert wait_for_no_ranks() == []


@pytest.mark.timeout(150)
def test_teardown_leaves_nothing_even_when_the_body_fails(tmp_path):
    require_harness()
    seen = {}
    with pytest.raises(RuntimeError, match="on purpose"):
        with netns_spark_cluster(tmp_path, workers=2, cores=1, timeout_s=120) as cluster:
            seen["tag"] = cluster.tag
            seen["names"] = netns.found_names(cluster.tag)[cluster.tag]
            seen["inodes"] = set(cluster.netns_inodes.values())
            seen["procs"] = cluster.processes()
            raise RuntimeError("on purpose")
    # Before: master, two anchors, two workers, at least; all named as expected.
    assert len(seen["procs"]) >= 5
    assert len(seen["names"]["netns"]) == 2 and len(seen["names"]["etc"]) == 2
    assert len(seen["names"]["links"]) == 3  # the bridge and two host-side veths

    tag = seen["tag"]
    assert netns.found_names(tag) == {}
    assert tag not in subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert tag not in subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    assert not [e for e in os.listdir(netns.NETNS_ETC) if tag in e]
    assert tag not in {r.tag for r in registry.records()}
    assert _survivors(seen["procs"], seen["inodes"], tag) == []


@pytest.mark.timeout(60)
def test_down_removes_what_a_killed_run_left(tmp_path):
    require_harness()
    # A run that dies by SIGKILL half way: record, namespaces and a host up, no teardown.
    crashed = subprocess.Popen(
        [sys.executable, "-c", CRASHING_RUN, str(tmp_path)],
        stdout=subprocess.PIPE,
        text=True,
        cwd=str(cleanup.PROJECT_ROOT),
        start_new_session=True,
    )
    try:
        tag = crashed.stdout.readline().strip()
        namespaces = netns.found_names(tag)[tag]["netns"]
        assert len(namespaces) == 2, "the run did not get as far as its hosts"
        inside = [psutil.Process(pid) for ns in namespaces for pid in netns.namespace_pids(ns)]
        assert inside, "the crashed run's host had no process"
    finally:
        os.killpg(crashed.pid, signal.SIGKILL)
        crashed.wait(10)
    assert any(r.tag == tag and not r.owner_alive() for r in registry.records())

    report = cleanup.down(stop_live=())
    assert f"removed run {tag}" in report
    assert netns.found_names(tag) == {}
    assert tag not in {r.tag for r in registry.records()}
    assert [p.pid for p in inside if _alive(p)] == []


CRASHING_RUN = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from tests.cluster import netns, registry

    record = registry.claim("pytest")
    net = netns.layout(record.tag, record.subnet, 2)
    netns.create(net)
    netns.start_host(net.hosts[0], Path(sys.argv[1]) / "anchor.log")
    print(record.tag, flush=True)
    time.sleep(60)
    """
)


def _survivors(procs, inodes, tag) -> list[str]:
    """Processes of the run still alive: the ones seen during it, or any in its namespaces."""
    left = [f"{p.pid} {_cmdline(p)[:3]}" for p in procs if _alive(p)]
    for proc in psutil.process_iter():
        try:
            inode = int(os.readlink(f"/proc/{proc.pid}/ns/net").split("[")[1].rstrip("]"))
        except (OSError, IndexError, ValueError):
            continue
        if inode in inodes or ("tests.cluster" in _cmdline(proc) and tag in _cmdline(proc)):
            left.append(f"{proc.pid} {_cmdline(proc)[:3]}")
    return left


def _alive(proc: psutil.Process) -> bool:
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _cmdline(proc: psutil.Process) -> list[str]:
    try:
        return proc.cmdline()
    except psutil.Error:
        return []
