"""What the executors hold, and the one line for a Connect client on another Python."""

from __future__ import annotations

import sys

import pytest

from hvdflow.infra import executor_python

# What a Connect client got from pyspark when its Python was not the executors' (2026-12-02).
SPARK_SAID = (
    "[PYTHON_VERSION_MISMATCH] Python in worker has different version: 3.11 than that in "
    "driver: 3.13, PySpark cannot run with different minor versions. Please check environment "
    "variables PYSPARK_PYTHON and PYSPARK_DRIVER_PYTHON are correctly set."
)


@pytest.mark.unit
def test_a_version_mismatch_names_both_pythons_and_the_client_to_use():
    found = executor_python._MISMATCH.search(SPARK_SAID)
    line = executor_python.mismatch_line(found.group(1), found.group(2))
    assert line == (
        "this Spark Connect client runs Python 3.13 and the executors Python 3.11: pyspark runs a "
        "client's functions only on its own minor version; use a client on Python 3.11 (from a "
        "checkout: scripts/setup.sh client-classic (.venv-client-classic))"
    )
    # Older pyspark wrote the versions as tuples.
    older = "Python in worker has different version (3, 12) than that in driver 3.13, PySpark"
    found = executor_python._MISMATCH.search(older)
    assert "executors Python 3.12" in executor_python.mismatch_line(*found.groups())
    assert "an environment with Python 3.12" in executor_python.mismatch_line(*found.groups())


@pytest.mark.unit
def test_a_classic_session_is_answered_by_this_process():
    here = executor_python.here()
    assert here.python.startswith(f"{sys.version_info[0]}.{sys.version_info[1]}.")
    assert here.executable == sys.executable
    assert executor_python.executor_python(None) == here
    has_horovod = "horovod" in here.modules
    assert executor_python.default_engine(None) == ("horovod" if has_horovod else "tf_collective")
