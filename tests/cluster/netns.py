"""Simulated hosts on one Linux machine: a bridge, and per host a network namespace.

The driver's side (the bridge address) stays in the root namespace. Each host is a network
namespace joined to the bridge by a veth pair, with its own address, its own hostname (a UTS
namespace) that resolves to that address, and its own /tmp, /var/tmp and /dev/shm (a mount
namespace with fresh tmpfs mounts). A sleeping "anchor" process holds the host's mount and UTS
namespaces for its whole life; everything that runs "on the host" enters the anchor's
namespaces with nsenter, so it sees that host's disk, not a fresh one.

Nothing here routes anywhere else: the namespaces have no default route, and the bridge
carries only the harness's own /24. Every name starts with PREFIX and the run's tag, so a later
run (or ``python -m tests.cluster down``) can find and remove what a crashed run left.
"""

from __future__ import annotations

import ipaddress
import os
import re
import select
import shutil
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from tests.cluster import processes

# Every name the harness creates starts with this, then a 4-hex-digit tag of the run.
PREFIX = "hvdc"
# netns "hvdc<tag>-host<i>", bridge "hvdc<tag>br", host-side veth "hvdc<tag>h<i>" (its peer
# "...p" until it moves into the namespace as eth0); an outsider's netns "hvdc<tag>-outside"
# and veth "hvdc<tag>o". Linux interface names are <= 15 chars.
NAME_RE = re.compile(rf"^{PREFIX}(?P<tag>[0-9a-f]{{4}})(?:br|h\d+p?|op?|-host\d+|-outside)$")
# Outsiders' /30 links: RFC 2544's benchmarking range, which no real network routes.
OUTSIDE_NETWORK = ipaddress.ip_network("198.18.0.0/15")
# `ip netns exec NS` bind-mounts every file of /etc/netns/NS over /etc (hosts, here).
NETNS_ETC = Path("/etc/netns")
NETNS_RUN = Path("/run/netns")
DRIVER_HOSTNAME = "hvd-driver"
# Inside each host: HOME, the Spark worker's work dir and Spark's local dirs, all on its tmpfs.
HOST_HOME = "/tmp/home"
HOST_WORK_DIR = "/tmp/work"
HOST_LOCAL_DIRS = "/tmp/spark-local"
# Bounds for single `ip` commands and for an anchor to set its host up.
IP_TIMEOUT_S = 15.0
HOST_READY_S = 15.0

# The folders each host gets a fresh tmpfs on: its own local disk.
PRIVATE_DIRS = ("/tmp", "/var/tmp", "/dev/shm")

# Runs as the anchor, inside the new namespaces; $1 is the hostname, the rest are shared
# install paths (the checkout, its venv) that lie under a private dir and must stay visible:
# a clone in /tmp would otherwise vanish under the host's own /tmp. Each is held aside on a
# bind mount, the tmpfs mounts go on, and each is moved back to the same path.
_ANCHOR_SCRIPT = rf"""set -e
hostname "$1"
shift
i=0
for path in "$@"; do
  hold=$(mktemp -d -p /run hvdflow-keep.XXXXXX)
  mount --bind "$path" "$hold"
  eval "hold_$i=$hold"
  i=$((i + 1))
done
# The host's own local disk: nothing written here is visible to the driver or other hosts.
for d in {" ".join(PRIVATE_DIRS)}; do mount -t tmpfs -o mode=1777 tmpfs "$d"; done
i=0
for path in "$@"; do
  eval "hold=\$hold_$i"
  mkdir -p "$path"
  mount --move "$hold" "$path"
  rmdir "$hold"
  i=$((i + 1))
done
mkdir -p {HOST_HOME} {HOST_WORK_DIR} {HOST_LOCAL_DIRS}
echo ready
exec sleep infinity
"""


def shared_install_paths() -> list[str]:
    """The checkout and this interpreter's environment, where they sit under a private dir
    (the outermost of them only): every host must still see them at the same path."""
    project = Path(__file__).resolve().parents[2]
    candidates = sorted({str(project), str(Path(sys.prefix).resolve())}, key=len)
    kept: list[str] = []
    for path in candidates:
        under_private = any(path == d or path.startswith(d + "/") for d in PRIVATE_DIRS)
        if under_private and not any(path.startswith(k + "/") or path == k for k in kept):
            kept.append(path)
    return kept


@dataclass(frozen=True)
class Host:
    """One simulated host: its hostname, address, network namespace and bridge-side veth."""

    name: str
    ip: str
    netns: str
    veth: str


@dataclass(frozen=True)
class Layout:
    """The names and addresses of one run, decided before anything is created."""

    tag: str
    bridge: str
    driver_ip: str
    hosts: tuple[Host, ...]


def layout(tag: str, subnet: str, count: int) -> Layout:
    """The layout of ``count`` hosts on ``subnet`` (its first three octets, e.g. "10.77.0")."""
    hosts = tuple(
        Host(
            name=f"hvd-host{i}",
            ip=f"{subnet}.{10 + i}",
            netns=f"{PREFIX}{tag}-host{i}",
            veth=f"{PREFIX}{tag}h{i}",
        )
        for i in range(1, count + 1)
    )
    return Layout(tag=tag, bridge=f"{PREFIX}{tag}br", driver_ip=f"{subnet}.1", hosts=hosts)


def hosts_file(net: Layout) -> str:
    """/etc/hosts as every host sees it: its peers and the driver, like a cluster's DNS.

    Without its own entry a host's name resolves to 127.0.0.1 (this machine's /etc/hosts), and
    Gloo ranks then tell their peers to connect to 127.0.0.1.
    """
    lines = ["127.0.0.1 localhost", f"{net.driver_ip} {DRIVER_HOSTNAME}"]
    lines += [f"{h.ip} {h.name}" for h in net.hosts]
    return "\n".join(lines) + "\n"


def unavailable_reason() -> str | None:
    """Why the harness cannot run here, or None when it can."""
    if not sys.platform.startswith("linux"):
        return "the multi-host harness needs Linux network and mount namespaces"
    if os.geteuid() != 0:
        return (
            "the multi-host harness needs root: it creates network namespaces, a bridge and "
            "tmpfs mounts (run these tests as root)"
        )
    for tool, package in (("ip", "iproute2"), ("unshare", "util-linux"), ("nsenter", "util-linux")):
        if shutil.which(tool) is None:
            return f"the multi-host harness needs `{tool}`: install {package} (make test does)"
    if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        return "the multi-host harness needs Java for Spark: install a Java 17 runtime"
    # A throwaway namespace: proves namespaces, bridges and veths can be made, touching nothing.
    probe = subprocess.run(
        [
            "unshare",
            "--net",
            "--mount",
            "--uts",
            "sh",
            "-c",
            "ip link add p0 type bridge && ip link add p1 type veth peer name p2",
        ],
        capture_output=True,
        text=True,
        timeout=IP_TIMEOUT_S,
    )
    if probe.returncode != 0:
        return (
            f"cannot create namespaces, bridges or veth pairs here ({probe.stderr.strip()}): "
            "the harness needs CAP_SYS_ADMIN and CAP_NET_ADMIN and the bridge/veth drivers"
        )
    return None


def ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    """Run one `ip` command, bounded; raise with its error text when ``check``."""
    done = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=IP_TIMEOUT_S)
    if check and done.returncode != 0:
        raise RuntimeError(f"`ip {' '.join(args)}` failed: {done.stderr.strip()}")
    return done


def create(net: Layout) -> None:
    """Create the bridge (driver address) and every host's namespace, veth pair and hosts file."""
    ip("link", "add", net.bridge, "type", "bridge")
    ip("addr", "add", f"{net.driver_ip}/24", "dev", net.bridge)
    ip("link", "set", net.bridge, "up")
    etc = hosts_file(net)
    for host in net.hosts:
        ip("netns", "add", host.netns)
        ip("link", "add", host.veth, "type", "veth", "peer", "name", host.veth + "p")
        ip("link", "set", host.veth, "master", net.bridge, "up")
        ip("link", "set", host.veth + "p", "netns", host.netns)
        # Inside, it is the host's eth0, as on a real machine.
        ip("-n", host.netns, "link", "set", host.veth + "p", "name", "eth0")
        ip("-n", host.netns, "addr", "add", f"{host.ip}/24", "dev", "eth0")
        ip("-n", host.netns, "link", "set", "eth0", "up")
        ip("-n", host.netns, "link", "set", "lo", "up")
        (NETNS_ETC / host.netns).mkdir(parents=True, exist_ok=True)
        (NETNS_ETC / host.netns / "hosts").write_text(etc)


@dataclass(frozen=True)
class Outsider:
    """A network namespace beside the cluster, off its bridge: a laptop or an orchestrator's
    container. It reaches the driver's address (and the services bound there) through this
    machine's root namespace, which forwards nothing; no host has a route back to it, so a
    host's connection to it fails at once with "Network is unreachable"."""

    netns: str
    veth: str  # the root namespace's end
    ip: str
    gateway: str  # the root namespace's address on the link

    def command(self, argv: Sequence[str]) -> list[str]:
        """``argv`` run in the outsider's network (this machine's files and hostname)."""
        return ["ip", "netns", "exec", self.netns, *argv]


def outsider(tag: str, driver_ip: str) -> Outsider:
    """The outsider of run ``tag``: a /30 of OUTSIDE_NETWORK chosen by the run's subnet, so
    that runs beside each other get different ones."""
    second, third = (int(part) for part in driver_ip.split(".")[1:3])
    blocks = list(OUTSIDE_NETWORK.subnets(new_prefix=30))
    link = blocks[(second * 256 + third) % len(blocks)]
    gateway, address = (str(a) for a in list(link.hosts())[:2])
    return Outsider(f"{PREFIX}{tag}-outside", f"{PREFIX}{tag}o", address, gateway)


def add_outsider(found: Outsider, driver_ip: str) -> None:
    """Create ``found``'s namespace and link, routed to the cluster's /24 only."""
    ip("netns", "add", found.netns)
    ip("link", "add", found.veth, "type", "veth", "peer", "name", found.veth + "p")
    ip("addr", "add", f"{found.gateway}/30", "dev", found.veth)
    ip("link", "set", found.veth, "up")
    ip("link", "set", found.veth + "p", "netns", found.netns)
    ip("-n", found.netns, "link", "set", found.veth + "p", "name", "eth0")
    ip("-n", found.netns, "addr", "add", f"{found.ip}/30", "dev", "eth0")
    ip("-n", found.netns, "link", "set", "eth0", "up")
    ip("-n", found.netns, "link", "set", "lo", "up")
    cluster_net = ipaddress.ip_network(f"{driver_ip}/24", strict=False)
    ip("-n", found.netns, "route", "add", str(cluster_net), "via", found.gateway)


def remove_outsider(found: Outsider) -> list[int]:
    """Stop what runs in ``found``'s namespace and remove it; the pids that would not die."""
    left = processes.kill_pids(namespace_pids(found.netns), grace_s=5)
    ip("link", "del", found.veth, check=False)  # its peer goes with it
    ip("netns", "del", found.netns, check=False)
    return left


def start_host(host: Host, log: Path) -> subprocess.Popen:
    """Start the host's anchor (hostname and private tmpfs set), once it reports ready."""
    with log.open("ab") as err:
        proc = subprocess.Popen(
            ["ip", "netns", "exec", host.netns]
            + ["unshare", "--mount", "--uts", "--propagation", "private"]
            + ["sh", "-c", _ANCHOR_SCRIPT, "sh", host.name, *shared_install_paths()],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=err,
            start_new_session=True,
        )
    try:
        ready, _, _ = select.select([proc.stdout], [], [], HOST_READY_S)
        line = proc.stdout.readline() if ready else b""
    finally:
        proc.stdout.close()
    if line.strip() != b"ready":
        processes.stop_groups([proc], grace_s=1)
        raise RuntimeError(
            f"host {host.name} ({host.netns}) did not set itself up within {HOST_READY_S:g} s "
            f"(tests.cluster.netns.HOST_READY_S); its log: {log}"
        )
    return proc


def enter(anchor_pid: int) -> list[str]:
    """The argv prefix that runs a command in the host of ``anchor_pid`` (net, mount, UTS)."""
    return ["nsenter", "-t", str(anchor_pid), "-n", "-m", "-u", "--"]


def host_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """A clean environment for commands on a host: its own HOME and TMPDIR, nothing forwarded."""
    env = {
        "PATH": os.environ.get("PATH", "/usr/sbin:/usr/bin:/sbin:/bin"),
        "LANG": os.environ.get("LANG", "C.UTF-8"),
        "HOME": HOST_HOME,
        "TMPDIR": "/tmp",
    }
    # The machine's Java, and its JVM options (the suite's, tests/jvm_options.py).
    for name in ("JAVA_HOME", "JDK_JAVA_OPTIONS"):
        if name in os.environ:
            env[name] = os.environ[name]
    env.update(extra or {})
    return env


def run_on_host(
    anchor_pid: int,
    command: str | Sequence[str],
    *,
    timeout_s: float = 30.0,
    env: Mapping[str, str] | None = None,
) -> subprocess.CompletedProcess:
    """Run ``command`` (a shell string or an argv) on the host, bounded; capture its output."""
    argv = ["sh", "-c", command] if isinstance(command, str) else list(command)
    return subprocess.run(
        enter(anchor_pid) + argv,
        capture_output=True,
        text=True,
        env=host_env(env),
        cwd="/",
        timeout=timeout_s,
    )


def set_link(host: Host, up: bool) -> None:
    """Cut (``up=False``) or restore the host's network cable: its bridge-side veth.

    Returns once the host's eth0 has lost its carrier, or has it back and traffic can flow.
    """
    ip("link", "set", host.veth, "up" if up else "down")
    deadline = time.monotonic() + IP_TIMEOUT_S
    while not _carrier(host) == up:
        if time.monotonic() > deadline:
            raise RuntimeError(
                f"{host.name}'s eth0 did not go {'up' if up else 'down'} within "
                f"{IP_TIMEOUT_S:g} s (tests.cluster.netns.IP_TIMEOUT_S)"
            )
        time.sleep(0.1)
    if up:
        # Addresses that failed to resolve while the cable was out stay FAILED for seconds
        # ("No route to host"); forget them on both ends, so traffic resumes at once.
        ip("-n", host.netns, "neigh", "flush", "dev", "eth0", check=False)
        ip("neigh", "flush", "to", host.ip, check=False)


def _carrier(host: Host) -> bool:
    state = ip("-n", host.netns, "-o", "link", "show", "eth0").stdout
    return "state UP" in state and "NO-CARRIER" not in state


def netns_inode(netns: str) -> int | None:
    """The namespace's inode: what /proc/PID/ns/net of its processes points at."""
    try:
        return os.stat(NETNS_RUN / netns).st_ino
    except OSError:
        return None


def namespace_pids(netns: str) -> list[int]:
    """Every process whose network namespace is ``netns``."""
    done = ip("netns", "pids", netns, check=False)
    return [int(p) for p in done.stdout.split() if p.isdigit()]


def found_names(tag: str | None = None) -> dict[str, dict[str, list[str]]]:
    """What exists now with the harness's names, by run tag: netns, links and /etc/netns dirs."""
    found: dict[str, dict[str, list[str]]] = {}

    def add(kind: str, name: str) -> None:
        m = NAME_RE.match(name)
        if m and (tag is None or m["tag"] == tag):
            found.setdefault(m["tag"], {"netns": [], "links": [], "etc": []})[kind].append(name)

    for line in ip("netns", "list", check=False).stdout.splitlines():
        if line.split():
            add("netns", line.split()[0])
    for line in ip("-o", "link", "show", check=False).stdout.splitlines():
        # "7: hvdc1a2bh1@if6: <...>": the name, without the peer suffix.
        parts = line.split(":", 2)
        if len(parts) > 1:
            add("links", parts[1].strip().split("@")[0])
    if NETNS_ETC.is_dir():
        for entry in NETNS_ETC.iterdir():
            add("etc", entry.name)
    return found


def destroy(tag: str) -> list[str]:
    """Remove everything of run ``tag``: processes in its namespaces, links, namespaces, files.

    Best effort and idempotent; returns what could not be removed (empty when all is gone).
    """
    names = found_names(tag).get(tag, {"netns": [], "links": [], "etc": []})
    problems = []
    for netns in names["netns"]:
        left = processes.kill_pids(namespace_pids(netns), grace_s=5)
        if left:
            problems.append(f"processes {left} in {netns}")
    # Deleting the bridge-side veth deletes its peer in the namespace too, at once; a deleted
    # namespace frees its end only when the kernel gets to it.
    for link in sorted(names["links"], key=lambda n: n.endswith("br")):
        ip("link", "del", link, check=False)
    for netns in names["netns"]:
        ip("netns", "del", netns, check=False)
    for etc in names["etc"]:
        shutil.rmtree(NETNS_ETC / etc, ignore_errors=True)
    deadline = time.monotonic() + IP_TIMEOUT_S
    while (left := found_names(tag).get(tag)) and time.monotonic() < deadline:
        time.sleep(0.2)
    if left:
        problems += [f"{kind} {', '.join(n)}" for kind, n in left.items() if n]
    return problems
