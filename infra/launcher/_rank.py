"""The rank process: ``python -m hvdflow.infra.launcher._rank PAYLOAD RESULT``.

PAYLOAD holds the cloudpickled ``(main, kwargs)``; rank 0 writes ``main``'s return value to
RESULT; an exception prints its traceback to stderr and exits 1. Before ``main`` loads, the rank
wraps its engine's entry points on import (nothing is imported just to be patched: TensorFlow's
import costs seconds), so that its task hears when the engine started.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import faulthandler
import importlib.abc
import importlib.util
import os
import signal
import sys
import threading
import traceback

import cloudpickle

from hvdflow.infra.constants import (
    HOROVOD_RANK,
    HOROVOD_TIMELINE,
    HVDFLOW_ENGINE,
    HVDFLOW_PARENT_PID,
    HVDFLOW_STACKS_FILE,
)
from hvdflow.infra.errors import TransientError
from hvdflow.infra.launcher import _engines, _task, _wire


class _ThenPatch(importlib.abc.Loader):
    """A module's own loader, followed by ``patch(module)`` once the module has run."""

    def __init__(self, loader, patch):
        self._loader, self._patch = loader, patch

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module) -> None:
        self._loader.exec_module(module)
        self._patch(module)

    def __getattr__(self, name):  # get_source and the rest: tracebacks still show the lines
        return getattr(self._loader, name)


class _PatchOnImport(importlib.abc.MetaPathFinder):
    """Patch a module when something first imports it, instead of importing it to patch it."""

    def __init__(self, name: str, patch):
        self._name, self._patch = name, patch

    def find_spec(self, fullname, path, target=None):
        if fullname != self._name:
            return None
        sys.meta_path.remove(self)  # once; and the other finders find the real module
        spec = importlib.util.find_spec(fullname)
        if spec is not None and spec.loader is not None:
            spec.loader = _ThenPatch(spec.loader, self._patch)
        return spec


def patch_on_import(name: str, patch) -> None:
    """``patch(module)`` now if ``name`` is loaded, else when something first imports it."""
    if name in sys.modules:
        patch(sys.modules[name])
    else:
        sys.meta_path.insert(0, _PatchOnImport(name, patch))


_PR_SET_PDEATHSIG = 1  # linux/prctl.h: a signal for when the thread that started us exits
_PR_SET_NAME = 15  # linux/prctl.h: the name ps, top and /proc/PID/comm show (15 bytes at most)
NAME_PREFIX = "hvdflow-rank"  # hvdflow-rank0, hvdflow-rank1, ...
_ORPHANED_EXIT = 128 + signal.SIGKILL  # the exit of a rank whose task is already gone
STACKS_SIGNAL = signal.SIGUSR1  # the rank writes its Python stacks (the task asks on a stall)


def _die_with_parent() -> None:
    """Ask for SIGKILL when the supervising task dies, so a killed Spark worker leaves no rank.
    (Not in ``preexec_fn``: unsafe with threads.) A task that died before this left the rank
    re-parented, never to get the signal: hence the parent pid check."""
    expected = os.environ.get(HVDFLOW_PARENT_PID)
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
            # Not fatal: the task still kills the rank's group on every way out but SIGKILL.
            print(
                f"hvdflow: prctl(PR_SET_PDEATHSIG) failed: {os.strerror(ctypes.get_errno())}",
                file=sys.stderr,
            )
    if expected is not None and os.getppid() != int(expected):
        os._exit(_ORPHANED_EXIT)


def _name_this_process() -> None:
    """Call this process hvdflow-rankN for top and ps (later threads inherit the name)."""
    if sys.platform.startswith("linux"):
        name = f"{NAME_PREFIX}{os.environ.get(HOROVOD_RANK, '0')}".encode()[:15]
        ctypes.CDLL(None).prctl(_PR_SET_NAME, ctypes.c_char_p(name), 0, 0, 0)


def _dump_stacks_on_signal() -> None:
    """Write every thread's Python stack to HVDFLOW_STACKS_FILE on STACKS_SIGNAL.

    faulthandler's handler runs in C: it answers even while the main thread is stuck in
    TensorFlow or a Horovod collective, where a Python signal handler would never run."""
    path = os.environ.get(HVDFLOW_STACKS_FILE)
    if path:
        stacks = open(path, "w")  # noqa: SIM115 (open for the life of the process)
        faulthandler.register(STACKS_SIGNAL, file=stacks, all_threads=True)


def main(argv: list[str]) -> int:
    payload_path, result_path = argv[1], argv[2]
    _die_with_parent()
    _name_this_process()
    _engines.bind_this_rank()  # before TensorFlow or Horovod start a thread: they all inherit it
    _dump_stacks_on_signal()
    rank_engine = _engines.engine(os.environ.get(HVDFLOW_ENGINE) or _wire.HOROVOD)
    rank_engine.in_rank()  # reports when this rank has joined the job (start timeout)
    _task.install_in_rank(patch_on_import)
    with open(payload_path, "rb") as f:
        fn, kwargs = cloudpickle.load(f)
    try:
        result = fn(**kwargs)
    except BaseException as e:
        traceback.print_exc()
        sys.stderr.flush()
        # A temporary failure: the training step retries it.
        return _wire.EXIT_TEMPFAIL if _transient(e) else 1
    if os.environ.get(HOROVOD_RANK, "0") == "0":
        try:
            data = cloudpickle.dumps(result)
        except Exception as e:
            print(
                f"main returned {type(result).__name__}, which cannot be pickled back to the "
                f"driver ({e}): return plain values, or save the object and return its path",
                file=sys.stderr,
            )
            return 1
        tmp = result_path + ".tmp"
        with open(tmp, "wb") as f:
            f.write(data)
        os.replace(tmp, result_path)
    if rank_engine.after_main is not None:
        rank_engine.after_main()
    return 0


def _transient(error: BaseException) -> bool:
    """Whether ``error`` or an exception it was raised from is a ``TransientError`` or a
    TensorFlow peer out of reach."""
    seen = set()
    while error is not None and id(error) not in seen:
        if isinstance(error, TransientError) or _tf_peer_out_of_reach(error):
            return True
        seen.add(id(error))
        error = error.__cause__ or error.__context__
    return False


def _tf_peer_out_of_reach(error: BaseException) -> bool:
    """TensorFlow's ``UnavailableError`` or ``DeadlineExceededError``: tf_collective's lost rank.

    The coordination service (rank 0) raises the first once a worker stops sending heartbeats; a
    worker whose heartbeats to rank 0 go unanswered raises the second. Looked up in
    ``sys.modules``: a rank that never imported TensorFlow cannot have raised them."""
    errors = sys.modules.get("tensorflow.python.framework.errors_impl")
    return errors is not None and isinstance(
        error, (errors.UnavailableError, errors.DeadlineExceededError)
    )


# Where each Horovod framework binding keeps its HorovodBasics (the ctypes handle on the library).
_HOROVOD_BASICS_MODULES = ("horovod.tensorflow.mpi_ops", "horovod.torch.mpi_ops")


def _close_horovod_timeline() -> None:
    """Write out rank 0's timeline before Horovod shuts down (a no-op on other ranks).

    Horovod's atexit shutdown stops its timeline writer thread at once, dropping queued events;
    ``stop_timeline`` waits until the writer has drained the queue and closed the file.
    """
    if not os.environ.get(HOROVOD_TIMELINE):
        return
    for name in _HOROVOD_BASICS_MODULES:
        mpi_ops = sys.modules.get(name)
        basics = getattr(mpi_ops, "_basics", None)
        if basics is not None and basics.is_initialized():
            try:
                basics.stop_timeline()
            except Exception as e:  # noqa: BLE001 (the run's own result is already decided)
                print(f"hvdflow: could not close the Horovod timeline: {e}", file=sys.stderr)
            return


def _exit_fast(code: int) -> None:
    """Exit as the interpreter would, minus module teardown (TensorFlow's takes a second per
    rank): non-daemon threads are joined, atexit handlers run, the streams are flushed."""
    for thread in threading.enumerate():
        if thread is not threading.main_thread() and not thread.daemon:
            thread.join()
    _close_horovod_timeline()
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
    os._exit(code)


if __name__ == "__main__":
    _exit_fast(main(sys.argv))
