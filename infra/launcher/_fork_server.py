"""Ranks on the driver (np<0) forked from a preloaded process of the driver's own.

On an executor, a rank forks from its Spark task, which hvdflow's pyspark daemon preloaded
(``_daemon``, ``_rank_fork``). A driver is no such process: a notebook's kernel, a Prefect task,
a test runner, with threads and state of its own, so its ranks were new interpreters, each
importing TensorFlow and Horovod again. The first np<0 run of a driver process starts this
server instead: a child of the driver that imports what the daemon imports, once, and then forks
each rank of that driver's runs on request, as the daemon's task would (``_rank_fork``'s
``fork_refusal`` decides there too; where it refuses, the rank starts as a new interpreter, as
before). Measured by ``python -m studies.rank_start --on-driver`` (BENCHMARKS.md).

The driver and the server talk over a Unix socket pair of datagrams (``SOCK_SEQPACKET``): a
start request carries the rank's pipes and inherited files (SCM_RIGHTS), and the server answers
with the rank's pid (or why it would not fork), then with its exit status. The rank is the
server's child: it dies with the server (PR_SET_PDEATHSIG, set by ``_rank``), and the server with
the driver (its own PR_SET_PDEATHSIG, and the socket's end).
"""

from __future__ import annotations

import ctypes
import fcntl
import json
import os
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Mapping, Sequence

from hvdflow.infra.constants import HVDFLOW_PARENT_PID
from hvdflow.infra.launcher import _rank_fork

SERVER_MODULE = "hvdflow.infra.launcher._fork_server"
# How long the driver waits for the server's answer to a start request: the first waits for
# the server's imports too.
ANSWER_TIMEOUT_S = 120.0
_MAX_MESSAGE = 1 << 20
# Where a forked rank's received files go first, out of the way of the numbers they take.
_HIGH_FD = 512
_PR_SET_PDEATHSIG = 1
# The server's folder at its start: sys.path[0] under `python -m`.
_STARTED_IN = os.getcwd()


class RankForkServer:
    """The driver's side: the server process, and the ranks it forked."""

    def __init__(self) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        started: list[subprocess.Popen] = []
        ready = threading.Event()

        def parent() -> None:
            # The server's PR_SET_PDEATHSIG fires when the thread that started it ends: a thread
            # of its own, living as long as the server, not the run's task thread.
            started.append(
                subprocess.Popen(
                    [sys.executable, "-m", SERVER_MODULE, str(theirs.fileno()), str(os.getpid())],
                    pass_fds=(theirs.fileno(),),
                    stdin=subprocess.DEVNULL,
                    start_new_session=True,  # Ctrl-C at the driver's terminal is the driver's
                )
            )
            ready.set()
            started[0].wait()

        threading.Thread(target=parent, name="hvdflow-fork-server-parent", daemon=True).start()
        ready.wait()
        theirs.close()
        self.process = started[0]
        self._sock = ours
        self._lock = threading.Lock()  # one start request at a time
        self._answered = threading.Condition()
        self._answers: dict[int, dict] = {}
        # Each forked rank's exit, as ``_rank_fork.ForkedRank`` reads it: an event and {"code"}.
        self._exited: dict[int, threading.Event] = {}
        self._ended: dict[int, dict] = {}
        self._next_id = 0
        self.alive = True
        threading.Thread(target=self._read, name="hvdflow-fork-server", daemon=True).start()

    def start_rank(
        self, argv: Sequence[str], env: Mapping[str, str], cwd: str, pass_fds: Sequence[int]
    ) -> _rank_fork.ForkedRank | str:
        """The forked rank, or why the server did not fork it (the caller starts it anew)."""
        out_read, out_write = os.pipe()
        err_read, err_write = os.pipe()
        with self._lock:
            self._next_id += 1
            request = {"id": self._next_id, "argv": list(argv), "env": dict(env), "cwd": cwd}
            request["fds"] = list(pass_fds)
            try:
                socket.send_fds(
                    self._sock,
                    [json.dumps(request).encode()],
                    [out_write, err_write, *pass_fds],
                )
            except OSError as e:
                self.alive = False
                answer = {"refused": f"the driver's fork server is gone ({e})"}
            else:
                answer = self._answer(self._next_id)
        os.close(out_write)
        os.close(err_write)
        if "pid" not in answer:
            os.close(out_read)
            os.close(err_read)
            return answer.get("refused", "the driver's fork server did not answer")
        pid = answer["pid"]
        return _rank_fork.ForkedRank(
            pid,
            os.fdopen(out_read, "rb"),
            os.fdopen(err_read, "rb"),
            self._exited[pid],
            self._ended[pid],
        )

    def _answer(self, request_id: int) -> dict:
        with self._answered:
            self._answered.wait_for(
                lambda: request_id in self._answers or not self.alive, ANSWER_TIMEOUT_S
            )
            return self._answers.pop(request_id, {"refused": "the driver's fork server is gone"})

    def _read(self) -> None:
        while True:
            try:
                data = self._sock.recv(_MAX_MESSAGE)
            except OSError:
                data = b""
            if not data:
                break
            message = json.loads(data)
            if "exited" in message:
                self._ended[message["exited"]]["code"] = message["code"]
                self._exited[message["exited"]].set()
                continue
            if "pid" in message:
                self._exited[message["pid"]] = threading.Event()
                self._ended[message["pid"]] = {"pid": message["pid"]}
            with self._answered:
                self._answers[message["id"]] = message
                self._answered.notify_all()
        # The server died: its ranks died with it (their PR_SET_PDEATHSIG).
        self.alive = False
        for pid, exited in list(self._exited.items()):
            if not exited.is_set():
                self._ended[pid]["code"] = -signal.SIGKILL
                exited.set()
        with self._answered:
            self._answered.notify_all()

    def close(self) -> None:
        self.alive = False
        self._sock.close()  # the server exits at the socket's end
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()


_server: RankForkServer | None = None
_server_lock = threading.Lock()


def start_rank(
    argv: Sequence[str], env: Mapping[str, str], cwd: str, pass_fds: Sequence[int]
) -> _rank_fork.ForkedRank | str:
    """A rank of this driver forked from its fork server (started by the first call), or why
    not: the caller starts it as a new interpreter."""
    global _server
    with _server_lock:
        if _server is None or not _server.alive or _server.process.poll() is not None:
            _server = RankForkServer()
        server = _server
    return server.start_rank(argv, env, cwd, pass_fds)


# --- the server process ---------------------------------------------------------------------


def serve(sock: socket.socket) -> None:
    """Answer start requests until the driver closes its end."""
    send_lock = threading.Lock()

    def answer(message: dict) -> None:
        with send_lock:
            try:
                sock.send(json.dumps(message).encode())
            except OSError:  # the driver is gone: so is this server, in a moment
                pass

    while True:
        try:
            data, fds, _flags, _addr = socket.recv_fds(sock, _MAX_MESSAGE, 64)
        except OSError:
            return
        if not data:
            return
        request = json.loads(data)
        refusal = _rank_fork.fork_refusal(request["env"])
        if refusal is not None:
            for fd in fds:
                os.close(fd)
            answer({"id": request["id"], "refused": refusal})
            continue
        threading.Thread(
            target=_fork_and_wait,
            args=(request, fds, answer),
            name="hvdflow-rank-parent",
            daemon=True,
        ).start()


def _fork_and_wait(request: dict, fds: list[int], answer) -> None:
    """This thread forks the rank and is its parent thread until it exits (its
    PR_SET_PDEATHSIG fires when this thread ends, as with ``_rank_fork.ForkedRank``)."""
    ready_read, ready_write = os.pipe()
    # The rank checks that its parent is who started it: this server, not the driver's task.
    env = {**request["env"], HVDFLOW_PARENT_PID: str(os.getpid())}
    pid = os.fork()
    if pid == 0:  # the rank: never returns
        # The files arrived under numbers of this process's; the rank's variables name the
        # driver's (HVDFLOW_EVENT_FD): out of the way first, then onto those.
        moved = [fcntl.fcntl(fd, fcntl.F_DUPFD, _HIGH_FD) for fd in (*fds, ready_write)]
        out_write, err_write, *passed, ready = moved
        for fd, number in zip(passed, request["fds"], strict=True):
            os.dup2(fd, number)
        if sys.path and sys.path[0] == _STARTED_IN:  # `python -m` put its folder first
            sys.path[0] = os.path.abspath(request["cwd"])
        _rank_fork.run_forked_rank(
            request["argv"],
            env,
            request["cwd"],
            out_write,
            err_write,
            set(request["fds"]),
            ready,
        )
    for fd in (*fds, ready_write):
        os.close(fd)
    with os.fdopen(ready_read, "rb") as ready:
        ready.read(1)  # the rank is in its own session: the driver's _kill_group finds it
    answer({"id": request["id"], "pid": pid})
    _, status = os.waitpid(pid, 0)
    answer({"exited": pid, "code": os.waitstatus_to_exitcode(status)})


def _die_with(parent_pid: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent_pid:  # the driver died before the call above
        os._exit(0)


if __name__ == "__main__":
    _die_with(int(sys.argv[2]))
    from hvdflow.infra.launcher import _daemon

    _daemon.preload()
    serve(socket.socket(fileno=int(sys.argv[1])))
