"""What the services tests look at: which processes of a group still run, and an address
beyond loopback to bind."""

from __future__ import annotations

import ipaddress
import os
import socket

import psutil


def running_in_group(pgid: int) -> list[int]:
    """Pids of the processes of group ``pgid`` that have not exited (zombies left out)."""
    found = []
    for process in psutil.process_iter(["status"]):
        try:
            if os.getpgid(process.pid) == pgid and process.info["status"] != "zombie":
                found.append(process.pid)
        except ProcessLookupError:
            pass
    return found


def non_loopback_address() -> str | None:
    """An IPv4 address of this machine, not on loopback, that a server can bind; None if none.

    First the address this machine would send from (a UDP connect sends nothing), then those
    of its interfaces.
    """
    candidates = []
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect(("198.51.100.1", 9))  # TEST-NET-2: only the route is looked up
            candidates.append(s.getsockname()[0])
    except OSError:
        pass
    for addresses in psutil.net_if_addrs().values():
        candidates += [a.address for a in addresses if a.family == socket.AF_INET]
    for address in candidates:
        if ipaddress.ip_address(address).is_loopback:
            continue
        with socket.socket() as s:
            try:
                s.bind((address, 0))
            except OSError:
                continue
        return address
    return None
