"""Which harness runs exist on this machine: one small JSON record per run, under /run.

A run writes its record (owner process, tag, subnet) before it creates anything and deletes it
only once everything is gone, so a record whose owner is dead marks a crashed run whose
leftovers may be removed, and two runs at once never pick the same names or addresses.
/run is cleared at boot, as namespaces and links are.
"""

from __future__ import annotations

import fcntl
import ipaddress
import json
import os
import secrets
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path

from tests.cluster import netns, processes

STATE_DIR = Path("/run/hvdflow-netns")
# The /24s a run may take: 10.77.0.0/24 .. 10.79.255.0/24, the first one no interface uses.
SUBNET_SECOND_OCTETS = (77, 78, 79)


@dataclass
class RunRecord:
    """One run of the harness, as other processes (``down``, the watchdog) see it."""

    tag: str
    subnet: str  # first three octets of the run's /24, e.g. "10.77.0"
    owner_pid: int
    owner_started: float
    kind: str  # "pytest" or "up": `down` stops "up" runs, leaves live test runs alone
    # Processes outside the namespaces (the master), as (pid, start time).
    pids: dict[str, list[float]] = field(default_factory=dict)

    @property
    def path(self) -> Path:
        return STATE_DIR / f"{self.tag}.json"

    def owner_alive(self) -> bool:
        return processes.is_alive(self.owner_pid, self.owner_started)

    def save(self) -> None:
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(asdict(self)))
        tmp.replace(self.path)  # readers never see half a record


@contextmanager
def _locked() -> Iterator[None]:
    """Serialises choosing a tag and subnet between runs that start at the same moment."""
    STATE_DIR.mkdir(mode=0o700, parents=True, exist_ok=True)
    with open(STATE_DIR / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def records() -> list[RunRecord]:
    """Every run record on this machine."""
    if not STATE_DIR.is_dir():
        return []
    found = []
    for path in sorted(STATE_DIR.glob("*.json")):
        try:
            found.append(RunRecord(**json.loads(path.read_text())))
        except (OSError, ValueError, TypeError):
            continue  # removed meanwhile, or not ours
    return found


def claim(kind: str) -> RunRecord:
    """Record a new run with a tag and a /24 that no run and no interface uses."""
    me = processes.identity(os.getpid())
    with _locked():
        taken = records()
        tags = {r.tag for r in taken} | set(netns.found_names())
        tag = next(t for t in iter(lambda: secrets.token_hex(2), None) if t not in tags)
        record = RunRecord(
            tag=tag,
            subnet=_free_subnet({r.subnet for r in taken}),
            owner_pid=me[0],
            owner_started=me[1],
            kind=kind,
        )
        record.save()
    return record


def release(record: RunRecord) -> None:
    record.path.unlink(missing_ok=True)


def _free_subnet(recorded: set[str]) -> str:
    used = []
    for line in netns.ip("-o", "-4", "addr", "show", check=False).stdout.splitlines():
        parts = line.split()
        if "inet" in parts:
            used.append(ipaddress.ip_interface(parts[parts.index("inet") + 1]).network)
    for second in SUBNET_SECOND_OCTETS:
        for third in range(256):
            subnet = f"10.{second}.{third}"
            net = ipaddress.ip_network(f"{subnet}.0/24")
            if subnet not in recorded and not any(net.overlaps(u) for u in used):
                return subnet
    raise RuntimeError(
        "every /24 in 10.77.0.0-10.79.255.0 is in use: run `python -m tests.cluster down` to "
        "remove harness leftovers"
    )
