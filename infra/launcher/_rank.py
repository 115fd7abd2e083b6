"""Entry point of one rank process: ``python -m hvdflow.infra.launcher._rank PAYLOAD RESULT``.

PAYLOAD holds the cloudpickled ``(main, kwargs)``; rank 0 writes ``main``'s return value to
RESULT. An exception prints its traceback to stderr (which the supervising task streams to the
driver) and exits 1.
"""

from __future__ import annotations

import atexit
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
from hvdflow.infra.launcher import _task_context, _wire, tf_datasets
from hvdflow.infra.launcher._cores import bind_this_rank
from hvdflow.infra.launcher.rank_events import emit_event

# linux/prctl.h: the signal this process gets when the thread that started it exits.
_PR_SET_PDEATHSIG = 1
# Exit status of a rank that found its supervising task already gone (as if SIGKILLed).
_ORPHANED_EXIT = 128 + signal.SIGKILL
# The signal on which the rank writes its Python stacks (the task sends it when the run stalls).
STACKS_SIGNAL = signal.SIGUSR1
# Where TensorFlow defines MultiWorkerMirroredStrategy (CollectiveAllReduceStrategy).
_STRATEGY_MODULE = "tensorflow.python.distribute.collective_all_reduce_strategy"
# Where torch defines init_process_group (torch.distributed re-exports it).
_C10D_MODULE = "torch.distributed.distributed_c10d"
# How long a tf_collective worker that finished waits for the others to finish (the driver's own
# timeouts stop a run that hangs long before this).
_EXIT_BARRIER_MS = 24 * 3600 * 1000


def _die_with_parent() -> None:
    """Ask for SIGKILL when the supervising task dies, so a killed Spark worker leaves no rank.

    The task cannot set this between fork and exec (``preexec_fn``): that hook is unsafe in a
    process with threads, and every task has some. So the rank sets it on itself, before it
    loads main. The task may have died before that: then this process was already re-parented and
    will never get the signal, so compare the parent with the pid the task passed down, and
    exit at once if they differ.
    """
    expected = os.environ.get(HVDFLOW_PARENT_PID)
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
            # Not fatal: the task still kills the rank's process group on every way out it
            # controls; only a SIGKILLed task would leave this rank behind.
            print(
                f"hvdflow: prctl(PR_SET_PDEATHSIG) failed: {os.strerror(ctypes.get_errno())}",
                file=sys.stderr,
            )
    if expected is not None and os.getppid() != int(expected):
        os._exit(_ORPHANED_EXIT)


def _dump_stacks_on_signal() -> None:
    """Write every thread's Python stack to HVDFLOW_STACKS_FILE on STACKS_SIGNAL.

    faulthandler's handler runs in C, so it answers even while the main thread is stuck inside
    TensorFlow or a Horovod collective, where a Python signal handler would never run.
    """
    path = os.environ.get(HVDFLOW_STACKS_FILE)
    if path:
        stacks = open(path, "w")  # noqa: SIM115 (open for the life of the process)
        faulthandler.register(STACKS_SIGNAL, file=stacks, all_threads=True)


def _report_init_reached() -> None:
    """Wrap Horovod's init so the supervisor knows this rank joined the job (start timeout)."""
    from horovod.common import basics

    original = basics.HorovodBasics.init
    if getattr(original, "_hvdflow_wrapped", False):
        return

    def init(self, *args, **kwargs):
        result = original(self, *args, **kwargs)
        emit_event(_wire.EVENT_INIT)
        return result

    init._hvdflow_wrapped = True
    # Frameworks bind `init = _basics.init` at import, so patch the class before any import.
    basics.HorovodBasics.init = init


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


def _report_strategy_created() -> None:
    """The tf_collective engine's start: the rank created its MultiWorkerMirroredStrategy.

    Patched on the base class of ``tf.distribute.MultiWorkerMirroredStrategy`` (and of its
    deprecated ``experimental`` alias) when TensorFlow loads it, so that any code creating one
    counts. Not imported here: TensorFlow takes seconds of CPU to import, and a function that
    never uses it (a launcher check, a GPU-placement probe) should not pay for it.
    """

    def patch(cars) -> None:
        cls = cars.CollectiveAllReduceStrategy
        original = cls.__init__

        def init(self, *args, **kwargs):
            original(self, *args, **kwargs)
            emit_event(_wire.EVENT_INIT)

        cls.__init__ = init

    patch_on_import(_STRATEGY_MODULE, patch)


def _report_process_group_initialised() -> None:
    """The torch engine's start: the rank returned from ``init_process_group()``.

    Patched where torch defines it when torch loads; ``torch.distributed`` re-exports the
    module's function at import, so the package's name is patched too. Not imported here, for
    the same reason as TensorFlow above (torch's import takes a second of CPU).
    """

    def wrap(original):
        if getattr(original, "_hvdflow_wrapped", False):
            return original

        def init_process_group(*args, **kwargs):
            result = original(*args, **kwargs)
            emit_event(_wire.EVENT_INIT)
            return result

        init_process_group._hvdflow_wrapped = True
        return init_process_group

    def patch_c10d(module) -> None:
        module.init_process_group = wrap(module.init_process_group)

    def patch_package(module) -> None:
        if hasattr(module, "init_process_group"):  # absent where torch has no distributed
            module.init_process_group = wrap(module.init_process_group)

    patch_on_import(_C10D_MODULE, patch_c10d)
    patch_on_import("torch.distributed", patch_package)


def _wait_for_the_other_tf_workers() -> None:
    """Hold this tf_collective worker until every worker has returned from main.

    TensorFlow's collectives pull each tensor from the worker that holds it: a worker that has
    its own result may still be serving a peer's last read. Exiting then fails that peer with
    "Socket closed" (seen in CI at the final gather). The coordination service's barrier
    releases the workers together; without a strategy (main made none) there is nothing to wait
    for. A barrier that fails means a worker failed, and that worker's own exit reports it.
    """
    if "tensorflow" not in sys.modules:
        return  # main never loaded TensorFlow, so it made no strategy
    from tensorflow.python.eager import context

    if context.context().coordination_service is None:
        return
    try:
        context.context().wait_at_barrier("hvdflow_main_returned", _EXIT_BARRIER_MS)
    except Exception as e:  # noqa: BLE001 (this worker's own work is done)
        print(f"hvdflow: not every worker reached the end of main: {e}", file=sys.stderr)


def main(argv: list[str]) -> int:
    payload_path, result_path = argv[1], argv[2]
    _die_with_parent()
    bind_this_rank()  # before TensorFlow or Horovod start a thread: they all inherit it
    _dump_stacks_on_signal()
    if os.environ.get(HVDFLOW_ENGINE) == _wire.TF_COLLECTIVE:
        _report_strategy_created()
        # fit's end would wait up to a minute for tf.data's autotuning thread (tf_datasets).
        patch_on_import(tf_datasets.DEVICE_DATASETS_MODULE, tf_datasets.wrap_device_datasets)
    elif os.environ.get(HVDFLOW_ENGINE) == _wire.TORCH:
        _report_process_group_initialised()
    else:
        _report_init_reached()
    _task_context.install_in_rank(patch_on_import)
    with open(payload_path, "rb") as f:
        fn, kwargs = cloudpickle.load(f)
    try:
        result = fn(**kwargs)
    except BaseException as e:
        traceback.print_exc()
        sys.stderr.flush()
        # A temporary failure (a TransientError, such as the object store not answering):
        # another attempt may succeed, and the training step retries it.
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
    if os.environ.get(HVDFLOW_ENGINE) == _wire.TF_COLLECTIVE:
        _wait_for_the_other_tf_workers()
    return 0


def _transient(error: BaseException) -> bool:
    """Whether ``error``, or an exception it was raised from, is a ``TransientError``."""
    seen = set()
    while error is not None and id(error) not in seen:
        if isinstance(error, TransientError):
            return True
        seen.add(id(error))
        error = error.__cause__ or error.__context__
    return False


# Where each Horovod framework binding keeps its HorovodBasics (the ctypes handle on the library).
_HOROVOD_BASICS_MODULES = ("horovod.tensorflow.mpi_ops", "horovod.torch.mpi_ops")


def _close_horovod_timeline() -> None:
    """Write out rank 0's timeline before Horovod shuts down.

    Horovod's timeline writer is a thread that drains a queue of events; its shutdown (Horovod's
    atexit handler) stops that thread at once and drops what is still queued. A main that
    returns right after its last collective lost its whole timeline that way (an empty file, seen
    in CI on a busy machine). ``stop_timeline`` instead waits until the writer has drained the
    queue and closed the file. Only rank 0 writes a timeline; on other ranks this is a no-op.
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
    """Exit as the interpreter would, minus tearing down every module.

    TensorFlow's module teardown takes about a second per rank, and every run waits for the
    slowest rank to exit. What users rely on still happens: non-daemon threads are joined,
    atexit handlers run (Horovod's shutdown, MLflow's end_run), and the streams are flushed.
    """
    for thread in threading.enumerate():
        if thread is not threading.main_thread() and not thread.daemon:
            thread.join()
    _close_horovod_timeline()
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code)


if __name__ == "__main__":
    _exit_fast(main(sys.argv))
