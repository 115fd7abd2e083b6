"""What a rank tells its task beyond plain output: ``log_to_driver`` and ``report_progress``.

``log_to_driver``: a message shown even when rank output is not. Databricks' HorovodRunner shows
only these in ``driver_log_verbosity="log_callback_only"`` mode. It travels as a marked line on the
rank's stdout, in order with what the rank printed. Outside a HorovodRunner rank the message goes
to this module's logger instead. The other events go over the pipe named by HVDFLOW_EVENT_FD.

``report_progress``: batches begun and finished, which HorovodRunner's stall watch
(``stall_timeout_s``) reads. ``hvdflow.training.callbacks.ProgressCallback`` calls it from Keras.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import threading
import time

from hvdflow.infra.constants import HVDFLOW_EVENT_FD
from hvdflow.infra.launcher import _wire

logger = logging.getLogger(__name__)

_lock = threading.Lock()
_pipe = None


def _event_pipe():
    global _pipe
    if _pipe is None:
        fd = os.environ.get(HVDFLOW_EVENT_FD)
        if fd is None:
            return None
        _pipe = os.fdopen(int(fd), "w", buffering=1, closefd=False)
    return _pipe


def emit_event(event: str, **fields) -> bool:
    """Send one event (``_wire.EVENT_*``) to the supervising task; False outside a rank.

    Never raises.
    """
    with _lock:
        try:
            pipe = _event_pipe()
            if pipe is None:
                return False
            pipe.write(json.dumps({"event": event, "time": time.time(), **fields}) + "\n")
            return True
        except (OSError, ValueError):
            # Shipping logs is best effort: a closed pipe must never fail training.
            return False


# Databricks' log_to_driver: "If message length is greater than 4000, it will be truncated."
LOG_TO_DRIVER_CHARS = 4000
TRUNCATED_SUFFIX = "...(truncated)"


def log_to_driver(message: str) -> None:
    """Show ``message`` on the driver, tagged with this rank, whatever the log verbosity.

    As Databricks' ``sparkdl.horovod.log_to_driver``: a message over 4,000 characters is cut
    there and ends with ``...(truncated)``. It reaches the driver after what the rank printed
    before it (it travels on stdout, ``_wire.LOG_LINE_MARKER``).
    """
    text = str(message)
    if len(text) > LOG_TO_DRIVER_CHARS:
        text = text[:LOG_TO_DRIVER_CHARS] + TRUNCATED_SUFFIX
    if os.environ.get(HVDFLOW_EVENT_FD) is None or not _write_to_stdout(text):
        logger.info("%s", message)


def _write_to_stdout(text: str) -> bool:
    line = _wire.log_line(text, time.time()) + "\n"
    with _lock:
        try:
            if sys.stdout is not sys.__stdout__ and sys.stdout is not None:
                sys.stdout.flush()  # user code replaced stdout: what it holds goes first
            sys.__stdout__.write(line)
            sys.__stdout__.flush()
            return True
        except (AttributeError, OSError, ValueError):
            return False  # stdout closed by user code: the message goes to the logger


def report_progress(begun: int, finished: int, watch: bool = True) -> None:
    """Tell the stall watch how many batches this rank has begun and finished so far.

    ``watch=False`` says the rank left the batch loop (its last batch is done; it evaluates,
    saves or exits): no progress is expected from it until it reports with ``watch=True`` again.
    A no-op outside a HorovodRunner rank. Cheap enough for every batch.
    """
    emit_event(_wire.EVENT_PROGRESS, begun=int(begun), finished=int(finished), watch=bool(watch))
