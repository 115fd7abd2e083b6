"""pyspark's worker daemon, started after importing what a rank imports.

Spark starts one daemon per executor (``spark.python.daemon.module``, which hvdflow's sessions
set to this module) and forks every Python worker of that executor from it. With TensorFlow,
Horovod and pyarrow imported here once, a barrier task's rank can be a fork of its task
(``_rank_fork``): about 2.9 CPU-s less per rank, paid once per executor instead. A Python
worker that scores with a Keras model finds TensorFlow loaded too.

What fails to import is left out, with a line on stderr: ranks then start as new interpreters.
"""

from __future__ import annotations

import gc
import importlib
import importlib.util
import os
import sys

# What a Keras rank imports before its own code: a module missing here is skipped.
PRELOAD = ("tensorflow", "horovod.tensorflow.keras", "pyarrow", "boto3")


def preload() -> None:
    """Import ``PRELOAD`` with stdout on stderr: Spark reads the daemon's port from stdout."""
    sys.stdout.flush()
    saved = os.dup(1)
    os.dup2(2, 1)
    try:
        for name in PRELOAD:
            if _installed(name):
                importlib.import_module(name)
        tensorflow = sys.modules.get("tensorflow")
        if tensorflow is not None:
            tensorflow.keras.Model  # noqa: B018 (loads Keras, which TensorFlow loads lazily)
        from hvdflow.infra.launcher import _rank, _rank_fork  # noqa: F401, PLC0415
    except Exception as e:  # noqa: BLE001 (the daemon must start: ranks fall back to exec)
        problem = f"hvdflow: the pyspark daemon could not preload a rank's imports: {e!r}"
        sys.stderr.write(problem + "\n")
        return
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)
    # Objects made so far stay out of the collector's passes: a fork then shares their pages
    # instead of copying each one a pass touches.
    gc.freeze()
    _rank_fork.mark_preloaded()


def _installed(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):  # a parent package missing
        return False


if __name__ == "__main__":
    preload()
    from pyspark.daemon import manager

    manager()
