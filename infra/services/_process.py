"""A service's process: pick its port, start it in its own group, wait until it answers, stop it.

Plain functions of plain values; ``hvdflow.infra.services._service.Service`` puts them together into
the one shape every embedded server has.
"""

from __future__ import annotations

import ipaddress
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Collection
from pathlib import Path

import psutil

from hvdflow.infra.ports import unclaimed_port

logger = logging.getLogger(__name__)

# After SIGKILL, how long the stopper waits for the group to be gone before it gives up.
KILL_WAIT_S = 5.0
# How often the stopper looks whether the group is gone.
STOP_POLL_S = 0.1


# --- addresses and ports -------------------------------------------------------------------

# Where the embedded services listen unless told otherwise.
LOOPBACK = "127.0.0.1"
# Addresses that listen on every interface but name none that another host could use in a URL.
WILDCARD_ADDRESSES = frozenset({"0.0.0.0", "::", ""})


def is_loopback(host: str) -> bool:
    """Whether every address ``host`` names is on loopback. A name that does not resolve counts
    as beyond it: the safe answer when it decides whether a server requires credentials."""
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        pass
    try:
        infos = socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)
    except OSError:
        return False
    addresses = {info[4][0].split("%", 1)[0] for info in infos}
    return bool(addresses) and all(ipaddress.ip_address(a).is_loopback for a in addresses)


def url_host(host: str) -> str:
    """``host`` as it goes into a URL: an IPv6 address in brackets."""
    return f"[{host}]" if ":" in host else host


def check_bind_address(host: str) -> str:
    """``host`` if this machine can listen on it and other hosts can use it in a URL (a wildcard
    gives ranks on other hosts no address to connect to)."""
    if host in WILDCARD_ADDRESSES:
        raise ValueError(
            f"bind address {host!r} listens on every interface but names none that other hosts "
            "can connect to: pass the address of this machine that they reach (e.g. 10.0.0.5), "
            f"or {LOOPBACK} for this machine only"
        )
    try:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        with socket.socket(family) as s:
            s.bind((host, 0))
    except OSError as e:
        raise ValueError(
            f"bind address {host!r} is not an address of this machine ({e.strerror or e}): pass "
            f"one of its interfaces' addresses, or {LOOPBACK}"
        ) from None
    return host


def port_is_free(port: int, host: str = LOOPBACK) -> bool:
    """Whether a server could listen on ``port`` of ``host`` now. Asked with SO_REUSEADDR, as
    servers bind: a port left in TIME_WAIT by a crashed service is free for it to come back on."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
            return True
        except OSError:
            return False


def free_port(avoid: Collection[int] = frozenset(), *, host: str = LOOPBACK) -> int:
    """A free port on ``host`` not in ``avoid``, free on 127.0.0.1 too: SeaweedFS's S3 gateway
    listens there besides its bind address."""
    while True:
        port = unclaimed_port(host)
        if port not in avoid and (host == LOOPBACK or port_is_free(port)):
            return port


# --- processes ------------------------------------------------------------------------------


# A background job of a shell without job control (`hvdflow up &`, nohup, CI) inherits SIGINT
# ignored across exec. Prefect's worker stops on SIGTERM by sending itself SIGINT, so it would
# never stop: a service starts with SIGINT at its default, through this exec.
_SIGINT_AT_DEFAULT = (
    "import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); "
    "os.execvp(sys.argv[1], sys.argv[1:])"
)


def with_sigint_at_default(command: list[str]) -> list[str]:
    """``command`` through an exec that restores SIGINT's default if this process ignores it."""
    if signal.getsignal(signal.SIGINT) != signal.SIG_IGN:
        return command
    return [sys.executable, "-I", "-S", "-c", _SIGINT_AT_DEFAULT, *command]


def start_process(
    command: list[str],
    log_path: Path,
    env: dict[str, str] | None = None,
    *,
    cwd: Path | None = None,
) -> subprocess.Popen:
    """Run ``command`` in its own process group, output appended to ``log_path``."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("ab") as log:
        return subprocess.Popen(
            with_sigint_at_default(command),
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            cwd=cwd,
            start_new_session=True,  # its own group: stopping the group stops its workers too
        )


def is_running(pid: int) -> bool:
    """Whether process ``pid`` exists and has not exited (an unreaped zombie has exited)."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def group_members(pgid: int) -> list[int]:
    """The pids in process group ``pgid`` that have not exited, zombies left out."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return []  # the usual case once stopped: no need to look at every process
    except PermissionError:
        pass  # someone else's group still exists; look below which of its members run
    members = []
    for process in psutil.process_iter():
        try:
            if os.getpgid(process.pid) == pgid and process.status() != psutil.STATUS_ZOMBIE:
                members.append(process.pid)
        except (ProcessLookupError, psutil.NoSuchProcess):
            continue  # exited while we looked
        except psutil.AccessDenied:
            members.append(process.pid)  # cannot tell: count it as running
    return members


def stop_process_group(
    leader: subprocess.Popen | int | None, timeout_s: float, *, kill_expected: bool = False
) -> None:
    """Stop a service's whole process group: SIGTERM, then SIGKILL what is left after
    ``timeout_s``. ``kill_expected``: SIGKILL is the service's normal stop (logged at debug).

    ``leader``: the Popen ``start_process`` returned, or its pid from a state file (the group's
    id); the group is stopped even when only its workers are left, the leader reaped if ours.
    """
    if leader is None:
        return
    pgid = leader if isinstance(leader, int) else leader.pid
    if not _signal_group(pgid, signal.SIGTERM) or _wait_group_gone(leader, timeout_s):
        return
    logger.log(
        logging.DEBUG if kill_expected else logging.INFO,
        "process group %d outlived SIGTERM by %g s: sending SIGKILL",
        pgid,
        timeout_s,
    )
    if not _signal_group(pgid, signal.SIGKILL) or _wait_group_gone(leader, KILL_WAIT_S):
        return
    logger.warning(
        "process group %d still has processes %s %g s after SIGKILL",
        pgid,
        group_members(pgid),
        KILL_WAIT_S,
    )


def _signal_group(pgid: int, signum: int) -> bool:
    """Send ``signum`` to the group; False when the group has no process left."""
    try:
        os.killpg(pgid, signum)
        return True
    except ProcessLookupError:
        return False


def _wait_group_gone(leader: subprocess.Popen | int, timeout_s: float) -> bool:
    """Reap the leader if it is ours; True once no process of its group runs."""
    pgid = leader if isinstance(leader, int) else leader.pid
    deadline = time.monotonic() + timeout_s
    while True:
        running = group_members(pgid)
        _reap(leader)  # after looking: a leader that has exited by then is reaped now
        if not running:
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(STOP_POLL_S)


def _reap(leader: subprocess.Popen | int) -> None:
    if isinstance(leader, subprocess.Popen):
        if not is_running(leader.pid):
            # It has exited: wait() (unlike poll()) cannot miss it, so its pid is free after.
            try:
                leader.wait(timeout=KILL_WAIT_S)
            except subprocess.TimeoutExpired:
                pass
        return
    try:
        os.waitpid(leader, os.WNOHANG)
    except ChildProcessError:
        pass  # not this process's child: whoever started it reaps it


# --- readiness ------------------------------------------------------------------------------


def wait_until_ready(
    process: subprocess.Popen | None,
    probe: Callable[[], bool],
    *,
    what: str,
    timeout_s: float,
    setting: str,
    log_path: Path,
    interval_s: float = 0.3,
) -> None:
    """Poll ``probe()`` (True when ready; may raise while not) until it passes. Fails at once if
    the process exits, and after ``timeout_s`` naming ``setting`` and the probe's last error."""
    deadline = time.monotonic() + timeout_s
    last_error = "no answer yet"
    while True:
        if process is not None and process.poll() is not None:
            raise RuntimeError(
                f"{what} exited with code {process.returncode} while starting; see {log_path}"
            )
        try:
            if probe():
                return
        except Exception as e:  # not ready yet: keep polling
            last_error = f"{type(e).__name__}: {e}"
        if time.monotonic() >= deadline:
            break
        time.sleep(interval_s)
    raise RuntimeError(
        f"{what} was not ready within {timeout_s:g} s (set by {setting}); "
        f"last error: {last_error}; see {log_path}"
    )
