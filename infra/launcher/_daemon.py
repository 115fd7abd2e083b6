"""pyspark's worker daemon, started after importing what a rank imports.

Spark starts one daemon per executor (``spark.python.daemon.module``, which hvdflow's sessions
set to this module) and forks every Python worker of that executor from it. With ``PRELOAD``
imported here once, a barrier task's rank can be a fork of its task
(``_rank_fork``): about 2.9 CPU-s less per rank, paid once per executor instead. A Python
worker that scores with a Keras model finds TensorFlow loaded too.

Where an import fails, its output and the reason go to stderr, and ranks start as new
interpreters.
"""

from __future__ import annotations

import contextlib
import gc
import importlib
import importlib.util
import io
import os
import sys
import tempfile
from collections.abc import Iterator

# What a Keras rank imports before its own code, and OpenCV, which the image tasks import in
# the same Python workers: its import adds its folders to LD_LIBRARY_PATH, which a rank forked
# from a worker that imported it later would not have had when loaded (``_rank_fork`` would
# start a new interpreter). A module missing here is skipped.
PRELOAD = ("tensorflow", "horovod.tensorflow.keras", "pyarrow", "boto3", "cv2")


def preload() -> None:
    """Import ``PRELOAD``, their output held back: Spark reads the daemon's port from its
    stdout, and TensorFlow's import notices would reach the driver's console once per
    executor, untagged (a rank's own output is streamed, tagged with its rank, as before).
    Shown with the reason where an import fails."""
    environ_before = dict(os.environ)
    with _output_held() as held:
        try:
            for name in PRELOAD:
                if _installed(name):
                    importlib.import_module(name)
            tensorflow = sys.modules.get("tensorflow")
            if tensorflow is not None:
                tensorflow.keras.Model  # noqa: B018 (loads Keras, which TensorFlow loads lazily)
            from hvdflow.infra.launcher import _rank, _rank_fork  # noqa: F401, PLC0415
        except Exception as e:  # noqa: BLE001 (the daemon must start: ranks fall back to exec)
            failure = f"hvdflow: the pyspark daemon could not preload a rank's imports: {e!r}"
        else:
            failure = None
    if failure is not None:
        sys.stderr.write(held.getvalue() + failure + "; ranks start as new interpreters\n")
        return
    # Objects made so far stay out of the collector's passes: a fork then shares their pages
    # instead of copying each one a pass touches.
    gc.freeze()
    _rank_fork.mark_preloaded(environ_before)


@contextlib.contextmanager
def _output_held() -> Iterator[io.StringIO]:
    """Fds 1 and 2 into a temporary file for the block; its text in the yielded buffer after."""
    held = io.StringIO()
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    saved = [os.dup(1), os.dup(2)]
    with tempfile.TemporaryFile() as capture:
        os.dup2(capture.fileno(), 1)
        os.dup2(capture.fileno(), 2)
        try:
            yield held
        finally:
            for stream in (sys.stdout, sys.stderr):
                stream.flush()
            for fd, target in zip(saved, (1, 2), strict=True):
                os.dup2(fd, target)
                os.close(fd)
            capture.seek(0)
            held.write(capture.read().decode("utf-8", "replace"))


def _installed(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):  # a parent package missing
        return False


if __name__ == "__main__":
    preload()
    from pyspark.daemon import manager

    manager()
