"""Picking a port to listen on a moment later, that nothing else takes meanwhile.

``bind(0)`` hands out a port from the ephemeral range, which outgoing connections draw from too:
one may take it before the server listens ("address already in use"). A random free port below
that range stays free, unless another program picks the same one.
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

    For a server a child starts a moment later (torch's TCPStore in rank 0): bound with
    ``SO_REUSEADDR`` and never listening, so that server (``SO_REUSEADDR`` too) can take it while
    a plain ``bind`` finds it taken. Held on every address, as torch's store listens on every one.
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
