"""How the executors of hvdflow's sessions and Connect server start their Python workers: forked
from ``hvdflow.infra.launcher._daemon``, which imports what a rank imports first, so that a rank
forks from its task instead of importing TensorFlow again (``infra/launcher/_rank_fork.py``)."""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping

from hvdflow.infra import constants as c

# pyspark caps each Python worker's address space with it (RLIMIT_AS): a worker forked from a
# daemon that has TensorFlow mapped would start near that cap.
PYSPARK_MEMORY = "spark.executor.pyspark.memory"


def python_daemon_conf(conf: Mapping[str, str], executor_python: str) -> dict[str, str]:
    """The daemon setting to add to ``conf`` for executors running ``executor_python``.

    None where the conf names a daemon of its own or caps the workers' memory, and none where
    the executors run another interpreter than this one, which hvdflow is installed in: a packed
    environment (``spark.archives``) may not hold hvdflow, and Spark fails every Python task
    whose daemon module is missing."""
    if c.SPARK_PYTHON_DAEMON_MODULE in conf or PYSPARK_MEMORY in conf:
        return {}
    if os.path.abspath(executor_python) != os.path.abspath(sys.executable):
        return {}
    return {c.SPARK_PYTHON_DAEMON_MODULE: c.RANK_PRELOADING_DAEMON}
