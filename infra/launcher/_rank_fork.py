"""A rank forked from its task instead of started as a new interpreter, where that is the same.

A Spark session that hvdflow makes starts pyspark's Python workers from ``_daemon``, which has
imported TensorFlow, Horovod and the rest of what a rank imports before it forks any worker
(``mark_preloaded``). A barrier task is such a worker, so its rank can be a fork of the task:
it finds those modules loaded: each rank of a np=2 launch used 0.52 CPU-s against 2.62
(``studies/rank_start.py``). Everything else stays as with ``python -m
hvdflow.infra.launcher._rank``: the rank is the task's child, in a session of its own, its
stdout and stderr are pipes the task reads, it gets the same variables, and it runs
``_rank.main``.

A fork cannot change what a module read from the environment when it was imported, so a rank
is forked only when its variables differ from the daemon's in names read later (``READ_LATE``:
Horovod's, hvdflow's, a framework's rendezvous). Anything else (a user's ``extra_env`` of
``OMP_NUM_THREADS``, a GPU chosen by ``CUDA_VISIBLE_DEVICES``, a process that is not such a
worker) starts a new interpreter, as before.
"""

from __future__ import annotations

import atexit
import ctypes
import faulthandler
import io
import logging
import os
import signal
import subprocess
import sys
import threading
import warnings
import weakref
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from hvdflow.infra.constants import HVDFLOW_RANK_START, PYTHONPATH

RANK_MODULE = "hvdflow.infra.launcher._rank"
# Variables nothing reads at import: set in the forked rank, they act as in a new interpreter.
# (_MLFLOW_TELEMETRY_SESSION_ID: set by MLflow's import in a worker that scored with a model.)
READ_LATE_PREFIXES = (
    "HOROVOD_",
    "HVDFLOW_",
    "AWS_",
    "MLFLOW_",
    "_MLFLOW_",
    "SPARK_",
    "PYSPARK_",
    "TORCHELASTIC_",  # torchrun's run id and restarts: read by torch.distributed when called
)
READ_LATE = {
    "TF_CONFIG",  # read when a MultiWorkerMirroredStrategy is made (the tf_collective engine)
    "MASTER_ADDR",  # the torch engine's rendezvous, read by init_process_group
    "MASTER_PORT",
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    # The rest of torchrun's environment (torch.distributed.run documents it), which the torch
    # engine sets for scripts written for torchrun; torch is not preloaded, and reads them only
    # when called.
    "GROUP_RANK",
    "GROUP_WORLD_SIZE",
    "ROLE_RANK",
    "ROLE_WORLD_SIZE",
    "ROLE_NAME",
    "TMPDIR",  # tempfile's folder: forgotten in the fork (``_become_rank``)
    "PYTHONUNBUFFERED",  # the fork's streams are made unbuffered (``_become_rank``)
    PYTHONPATH,  # only entries taken away, which the fork takes off sys.path
    # pytest's name of the test it runs, set anew for each: a driver in a test runner (ranks
    # forked from its fork server, ``_fork_server``) differs in it at every test. No library
    # reads it at import.
    "PYTEST_CURRENT_TEST",
}
# Exit status of a forked rank whose set-up failed before main (as _rank's own failures: 1).
_SETUP_FAILED = 1

# Python 3.12+ warns at every fork of a process with threads, as a task is. The child touches
# none of the task's locks: it makes its own streams, closes the task's files and runs the rank.
warnings.filterwarnings(
    "ignore",
    message=r"This process .* is multi-threaded, use of fork\(\)",
    category=DeprecationWarning,
)


@dataclass(frozen=True)
class _Preloaded:
    environ: dict[str, str]
    # The environment before the imports: they set some variables themselves (TensorFlow's
    # TF2_BEHAVIOR, OpenCV's folders on LD_LIBRARY_PATH), as a new interpreter's would.
    environ_before: dict[str, str]
    fds: dict[int, tuple[int, int]]  # fd -> (st_dev, st_ino): what the imports hold open
    finalizers: frozenset[int]  # the imports' weakref.finalize objects, by id
    modules: frozenset[str]  # what the daemon had imported
    exit_handlers_after: list  # what atexit.register was given after the imports
    register: Callable  # atexit.register and atexit.unregister themselves
    unregister: Callable


_preloaded: _Preloaded | None = None


def mark_preloaded(environ_before: Mapping[str, str] | None = None) -> None:
    """Called by ``_daemon`` once its imports are done: this process's forks may become ranks.
    ``environ_before``: the environment before the imports (default: as it is now).

    From here on, what the daemon's workers and their tasks give ``atexit.register`` is noted, so
    that a forked rank can leave it out: a rank's exit runs the atexit handlers a new
    interpreter would have, not the task's (its TemporaryDirectory's clean-up removed the folder
    the rank had just written its result to)."""
    global _preloaded
    later: list = []
    register, unregister = atexit.register, atexit.unregister

    def noting_register(func, *args, **kwargs):
        later.append(func)
        return register(func, *args, **kwargs)

    def noting_unregister(func) -> None:  # what is gone from atexit is not held here either
        later[:] = [f for f in later if f != func]
        unregister(func)

    _preloaded = _Preloaded(
        dict(os.environ),
        dict(os.environ if environ_before is None else environ_before),
        _open_fds(),
        frozenset(map(id, _finalizers())),
        frozenset(sys.modules),
        later,
        register,
        unregister,
    )
    atexit.register, atexit.unregister = noting_register, noting_unregister


def imported_by_daemon(module: str) -> bool:
    """Whether ``module`` was loaded in this process by ``_daemon`` before its work began."""
    return _preloaded is not None and module in _preloaded.modules


def fork_refusal(env: Mapping[str, str]) -> str | None:
    """Why a rank with ``env`` cannot be a fork of this process, or None when it can."""
    if _preloaded is None:
        return "this process was not started by hvdflow's pyspark daemon"
    if (started := _runtime_started()) is not None:
        return started
    before, after = _preloaded.environ_before, _preloaded.environ
    # A variable the imports set is the same whether the rank has the value from before them
    # (a driver's environment) or after (a task's, inherited from the daemon).
    changed = sorted(
        k
        for k in set(env) | set(before) | set(after)
        if env.get(k) != after.get(k) and env.get(k) != before.get(k)
    )
    read_early = [k for k in changed if not _read_late(k)]
    if read_early:
        return f"the rank's environment differs in {', '.join(read_early)}, read at import"
    if PYTHONPATH in changed:
        kept = set(_path_entries(env.get(PYTHONPATH)))
        if kept - set(_path_entries(after.get(PYTHONPATH))):
            return "the rank's PYTHONPATH adds entries"
    return None


def _runtime_started() -> str | None:
    """Why a framework's runtime in this process would not survive a fork: a Python worker is
    reused, and one that ran TensorFlow or PyTorch before (scoring, a user's UDF) has started
    what a rank must configure itself (collective ops, thread pools: TensorFlow refuses once its
    context exists) or what breaks in a child (an OpenMP pool used by torch)."""
    eager = sys.modules.get("tensorflow.python.eager.context")
    context = getattr(eager, "_context", None)  # TensorFlow's own global, made at first use
    if context is not None and getattr(context, "_initialized", False):
        return "TensorFlow's runtime was started in this Python worker by earlier work"
    if "torch" in sys.modules and not imported_by_daemon("torch"):
        return "PyTorch was loaded in this Python worker by earlier work"
    return None


def _read_late(name: str) -> bool:
    return name in READ_LATE or name.startswith(READ_LATE_PREFIXES)


def start_rank(
    argv: Sequence[str],
    env: Mapping[str, str],
    cwd: str,
    pass_fds: Sequence[int],
    on_driver: bool = False,
):
    """The rank process: a fork of this one where ``fork_refusal`` allows; on the driver
    (``on_driver``, np<0), a fork of the driver's fork server (``_fork_server``) where its
    ``fork_refusal`` allows; else ``python -m _rank`` as a new interpreter. Either way its own
    session, stdin from /dev/null, stdout and stderr as pipes (``.stdout``, ``.stderr``), only
    ``pass_fds`` inherited, and HVDFLOW_RANK_START saying which way it started (and why not
    forked). A ``subprocess.Popen``, or an object with the part of its API the task uses."""
    refusal = fork_refusal(env)
    if refusal is None:
        return ForkedRank.start(argv, {**env, HVDFLOW_RANK_START: "forked"}, cwd, pass_fds)
    if on_driver:
        from hvdflow.infra.launcher import _fork_server  # noqa: PLC0415 (drivers only)

        forked = _fork_server.start_rank(
            argv, {**env, HVDFLOW_RANK_START: "forked by the driver's fork server"}, cwd, pass_fds
        )
        if not isinstance(forked, str):
            return forked
        refusal = forked
    return subprocess.Popen(
        [sys.executable, "-m", RANK_MODULE, *argv],
        env={**env, HVDFLOW_RANK_START: f"new interpreter: {refusal}"},
        cwd=cwd,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        pass_fds=tuple(pass_fds),
        start_new_session=True,  # its own process group: the task's _kill_group stops all of it
    )


class ForkedRank:
    """A forked rank, with the part of ``subprocess.Popen`` the task uses.

    A thread of its own forks it and then waits for its exit. That thread is the rank's parent
    thread: the rank's PR_SET_PDEATHSIG (``_rank``) fires when it ends, which is when the rank
    has ended or the task's process died. And the rank's Python stack starts in that thread,
    a few frames deep, not under the task's: TensorFlow's "defined at" traces, and so the last
    lines of output a failure shows, are those of a new interpreter's rank.
    """

    def __init__(self, pid: int, stdout, stderr, exited: threading.Event, ended: dict):
        self.pid, self.stdout, self.stderr = pid, stdout, stderr
        self._exited, self._ended = exited, ended

    @property
    def returncode(self) -> int | None:
        return self._ended["code"] if self._exited.is_set() else None

    @classmethod
    def start(
        cls, argv: Sequence[str], env: Mapping[str, str], cwd: str, pass_fds: Sequence[int]
    ) -> ForkedRank:
        out_read, out_write = os.pipe()
        err_read, err_write = os.pipe()
        ready_read, ready_write = os.pipe()
        forked, exited = threading.Event(), threading.Event()
        ended: dict = {}  # "pid" once forked, "code" once it has exited

        def parent() -> None:
            pid = os.fork()
            if pid == 0:  # the rank: never returns
                run_forked_rank(argv, env, cwd, out_write, err_write, {*pass_fds}, ready_write)
            ended["pid"] = pid
            forked.set()
            _, status = os.waitpid(pid, 0)
            ended["code"] = os.waitstatus_to_exitcode(status)
            exited.set()

        threading.Thread(target=parent, name="hvdflow-rank-parent", daemon=True).start()
        forked.wait()
        for fd in (out_write, err_write, ready_write):
            os.close(fd)
        # Wait until the child is in its own session: the task's _kill_group signals that
        # group, which must exist from the moment this returns (as Popen's exec guarantees).
        with os.fdopen(ready_read, "rb") as ready:
            ready.read(1)
        return cls(
            ended["pid"], os.fdopen(out_read, "rb"), os.fdopen(err_read, "rb"), exited, ended
        )

    def poll(self) -> int | None:
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if not self._exited.wait(timeout):
            raise subprocess.TimeoutExpired(RANK_MODULE, timeout)
        return self.returncode


def run_forked_rank(argv, env, cwd, out_write, err_write, keep, ready_write) -> None:
    """The forked child: become the rank, run it, exit; never returns."""
    try:
        _become_rank(env, cwd, out_write, err_write, keep | {ready_write}, ready_write)
        from hvdflow.infra.launcher import _rank  # noqa: PLC0415 (preloaded)

        sys.argv = [_rank.__file__, *argv]
        _show_the_rank_command(argv)
        _rank._exit_fast(_rank.main(sys.argv))
    except BaseException:  # noqa: BLE001 (the rank's exit status says it)
        try:
            import traceback  # noqa: PLC0415

            traceback.print_exc()
            sys.stderr.flush()
        finally:
            os._exit(_SETUP_FAILED)
    os._exit(_SETUP_FAILED)


def _show_the_rank_command(argv: Sequence[str]) -> None:
    """Write ``python -m hvdflow.infra.launcher._rank ARGS`` over the daemon's command line in
    this process's memory, the arguments that fit (what ``ps`` and ``pkill -f`` read: the daemon's
    argument area, not Python's copy in sys.argv). Best effort: the fork runs the same without."""
    try:
        with open("/proc/self/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
        start, end = int(fields[45]), int(fields[46])  # arg_start, arg_end (proc(5): 48, 49)
    except (OSError, ValueError, IndexError):
        return
    size, command = end - start, b""
    for arg in (sys.executable, "-m", RANK_MODULE, *argv):  # whole arguments only
        if len(command) + len(os.fsencode(arg)) + 1 > size:
            break
        command += os.fsencode(arg) + b"\0"
    if command:
        ctypes.memmove(start, command.ljust(size, b"\0"), size)


def _become_rank(
    env: Mapping[str, str],
    cwd: str,
    out_write: int,
    err_write: int,
    keep: set[int],
    ready_write: int,
) -> None:
    """In the forked child: what a new interpreter started by Popen would have differently."""
    os.setsid()
    os.write(ready_write, b"1")
    os.close(ready_write)
    devnull = os.open(os.devnull, os.O_RDONLY)
    for source, target in ((devnull, 0), (out_write, 1), (err_write, 2)):
        os.dup2(source, target)
    _close_fds_except({0, 1, 2} | (keep - {ready_write}))
    for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGCHLD, signal.SIGUSR1, signal.SIGUSR2):
        signal.signal(sig, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGPIPE, signal.SIG_IGN)  # as Python sets it at start
    signal.pthread_sigmask(signal.SIG_SETMASK, set())
    _use_environment(env)
    os.chdir(cwd)
    _fresh_streams()
    _forget_the_tasks_context()
    _forget_the_tasks_exit()
    if faulthandler.is_enabled():  # pyspark's, writing to the task's file
        faulthandler.disable()
    numpy = sys.modules.get("numpy")
    if numpy is not None:  # its global generator was seeded once, in the daemon
        numpy.random.seed()


def _forget_the_tasks_exit() -> None:
    """Neither the atexit handlers nor the ``weakref.finalize`` clean-ups that the task and its
    worker registered after the daemon's imports run at this rank's exit."""
    if _preloaded is None:
        return
    later = list(_preloaded.exit_handlers_after)
    atexit.register, atexit.unregister = _preloaded.register, _preloaded.unregister
    for func in later:
        atexit.unregister(func)
    for finalizer in _finalizers():
        if id(finalizer) not in _preloaded.finalizers:
            finalizer.atexit = False


def _finalizers() -> list[weakref.finalize]:
    """The live ``weakref.finalize`` objects (the registry is weakref's own, stable since 3.4)."""
    return list(getattr(weakref.finalize, "_registry", {}))


def _as_after_the_imports(env: Mapping[str, str]) -> dict[str, str]:
    """``env`` with what the preloaded imports set in it, where it has the value from before
    them: what a new interpreter's environment would be once it had imported the same."""
    merged = dict(env)
    if _preloaded is None:
        return merged
    before, after = _preloaded.environ_before, _preloaded.environ
    for name in set(before) | set(after):
        if before.get(name) != after.get(name) and env.get(name) == before.get(name):
            if name in after:
                merged[name] = after[name]
            else:
                merged.pop(name, None)
    return merged


def _use_environment(env: Mapping[str, str]) -> None:
    before = _preloaded.environ if _preloaded is not None else dict(os.environ)
    gone = set(_path_entries(before.get(PYTHONPATH))) - set(_path_entries(env.get(PYTHONPATH)))
    if gone:
        sys.path[:] = [entry for entry in sys.path if entry not in gone]
    os.environ.clear()  # os.environ's own methods: C's environment follows (putenv, unsetenv)
    os.environ.update(_as_after_the_imports(env))
    import tempfile  # noqa: PLC0415

    tempfile.tempdir = None  # read from TMPDIR again at its next use


def _fresh_streams() -> None:
    """New sys.stdin, stdout and stderr on fds 0-2, unbuffered as under PYTHONUNBUFFERED.

    The task's own stream objects are left alone: a thread of the task may have held one's lock
    at the fork, and what they buffered is the task's. Logging handlers that wrote to them
    (TensorFlow's, made at its import) write to the new ones."""
    old = {id(sys.stdout): "stdout", id(sys.stderr): "stderr"}
    encoding = getattr(sys.__stdout__, "encoding", None) or "utf-8"
    sys.stdin = sys.__stdin__ = open(0, encoding=encoding, closefd=False)  # noqa: SIM115
    sys.stdout = sys.__stdout__ = _unbuffered(1, encoding, "strict")
    sys.stderr = sys.__stderr__ = _unbuffered(2, encoding, "backslashreplace")
    loggers = [logging.getLogger()] + [
        logger
        for logger in logging.Logger.manager.loggerDict.values()
        if isinstance(logger, logging.Logger)
    ]
    for logger in loggers:
        for handler in logger.handlers:
            stream = getattr(handler, "stream", None)
            if isinstance(handler, logging.StreamHandler) and id(stream) in old:
                handler.stream = getattr(sys, old[id(stream)])


def _unbuffered(fd: int, encoding: str, errors: str) -> io.TextIOWrapper:
    """A stream as ``python -u`` makes it: text written through to the file, no buffer."""
    raw = io.FileIO(fd, "w", closefd=False)
    return io.TextIOWrapper(raw, encoding=encoding, errors=errors, write_through=True)


def _forget_the_tasks_context() -> None:
    """The task's ``TaskContext`` talks to Spark on the task's socket, closed here: a rank
    gets the task's through ``_task_context`` or none, as in a new interpreter."""
    taskcontext = sys.modules.get("pyspark.taskcontext")
    if taskcontext is not None:
        taskcontext.TaskContext._taskContext = None
        taskcontext.BarrierTaskContext._taskContext = None


def _close_fds_except(keep: set[int]) -> None:
    """Close what the task had open (its sockets to Spark and the driver), keeping ``keep`` and
    what the daemon's imports hold (a library's /dev/urandom)."""
    held = _preloaded.fds if _preloaded is not None else {}
    for fd, identity in _open_fds().items():
        if fd in keep or held.get(fd) == identity:
            continue
        try:
            os.close(fd)
        except OSError:
            pass


def _open_fds() -> dict[int, tuple[int, int]]:
    found = {}
    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        try:
            info = os.fstat(fd)
        except OSError:  # the listing's own fd, closed by now
            continue
        found[fd] = (info.st_dev, info.st_ino)
    return found


def _path_entries(value: str | None) -> list[str]:
    return [entry for entry in (value or "").split(os.pathsep) if entry]
