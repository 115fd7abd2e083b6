"""Entry point of one rank process: ``python -m infra._rank_bootstrap PAYLOAD RESULT``.

PAYLOAD holds the cloudpickled ``(main, kwargs)``; rank 0 writes ``main``'s return value to
RESULT. An exception prints its traceback to stderr (which the supervising task streams to the
driver) and exits 1.
"""

from __future__ import annotations

import atexit
import os
import sys
import threading
import traceback

import cloudpickle

from infra.constants import HOROVOD_RANK
from infra.driver_log import emit_event


def _report_init_reached() -> None:
    """Wrap Horovod's init so the supervisor knows this rank joined the job (start timeout)."""
    from horovod.common import basics

    original = basics.HorovodBasics.init
    if getattr(original, "_hvdflow_wrapped", False):
        return

    def init(self, *args, **kwargs):
        result = original(self, *args, **kwargs)
        emit_event("init")
        return result

    init._hvdflow_wrapped = True
    # Frameworks bind `init = _basics.init` at import, so patch the class before any import.
    basics.HorovodBasics.init = init


def main(argv: list[str]) -> int:
    payload_path, result_path = argv[1], argv[2]
    _report_init_reached()
    with open(payload_path, "rb") as f:
        fn, kwargs = cloudpickle.load(f)
    try:
        result = fn(**kwargs)
    except BaseException:
        traceback.print_exc()
        sys.stderr.flush()
        return 1
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
    return 0


def _exit_fast(code: int) -> None:
    """Exit as the interpreter would, minus tearing down every module.

    TensorFlow's module teardown takes about a second per rank, and every run waits for the
    slowest rank to exit. What users rely on still happens: non-daemon threads are joined,
    atexit handlers run (Horovod's shutdown, MLflow's end_run), and the streams are flushed.
    """
    for thread in threading.enumerate():
        if thread is not threading.main_thread() and not thread.daemon:
            thread.join()
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code)


if __name__ == "__main__":
    _exit_fast(main(sys.argv))
