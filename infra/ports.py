"""Picking a port to listen on a moment later, that nothing else takes meanwhile.

A port the kernel hands out for ``bind(0)`` comes from its ephemeral range, the same range every
outgoing connection on the machine draws its local port from: between the pick and the listen, a
client connection (an HTTP request, a JVM's RPC) may take it, and the server fails to start
("Could not start gRPC server", "address already in use"). Ports below that range are handed to
no connection, so a random one of them that is free now stays free, unless another program
picks the same one.
"""

from __future__ import annotations

import random
import socket

# Below the ephemeral range and above the well-known and most registered services' ports.
LOWEST = 15000
# Linux's default ephemeral range starts here (ip_local_port_range); read the real one if we can.
EPHEMERAL_DEFAULT = 32768
TRIES = 100

_random = random.SystemRandom()


def ephemeral_start() -> int:
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return EPHEMERAL_DEFAULT


def is_bindable(port: int, host: str) -> bool:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def unclaimed_port(host: str) -> int:
    """A port free on ``host`` now, outside the range outgoing connections draw from (a port
    from ``bind(0)`` if none of the tries is free)."""
    top = ephemeral_start()
    if top > LOWEST + 1000:
        for _ in range(TRIES):
            port = _random.randrange(LOWEST, top)
            if is_bindable(port, host):
                return port
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def hold_port(host: str) -> socket.socket:
    """A port from ``unclaimed_port``'s range, bound and kept bound until the socket closes.

    For a server that a child process starts a moment later (torch's TCPStore in rank 0): the
    socket is bound with ``SO_REUSEADDR`` and never listens, so that server, which binds with
    ``SO_REUSEADDR`` too, can still take the port, while a plain ``bind`` (every other pick
    here, ``is_bindable``) finds it taken until the holder closes it. Without the hold, another
    program's pick in the seconds rank 0 takes to import torch could land on the same port.
    It holds the port on every address, not only ``host``'s: torch's store listens on every
    address, so a server another pick put on the same port of another address (a service on
    a cluster's address) would keep it off as surely.
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    for _ in range(TRIES):
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("", unclaimed_port(host)))
        except OSError:  # taken between the pick and this bind
            sock.close()
            continue
        return sock
    raise OSError(f"no port free on {host} to hold after {TRIES} tries")
