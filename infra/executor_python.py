"""What the executors' Python holds, asked of them in a one-task stage, once per session.

A Spark Connect client sees neither the executors' packages nor their Python, and a thin one
(pyspark-client, no TensorFlow) holds none of the engines: the engine a run gets, and the error
when the executors lack it, are decided from the executors' answer. A classic session's driver is
the executors' environment in practice, and is asked directly.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import platform
import re
import sys
from collections.abc import Iterator

from hvdflow.infra import constants as c
from hvdflow.infra import extras
from hvdflow.infra.connect import is_connect

# The modules the engines and trainers need, of which the executors say which they hold.
ASKED = ("horovod", "tensorflow", "torch")
_SCHEMA = "python string, executable string, modules string"
# pyspark's PYTHON_VERSION_MISMATCH, as the worker raises it.
_MISMATCH = re.compile(
    r"Python in worker has different version:?\s*\(?([\d, .]+?)\)?\s+than that in driver:?\s*"
    r"\(?([\d, .]+?)\)?[,\s]"
)
# The thin clients a checkout sets up, by the executors' Python (scripts/setup.sh PROFILE).
THIN_CLIENTS = {"3.11": "client-classic (.venv-client-classic)", "3.13": "client (.venv-client)"}


class ExecutorPythonMismatch(RuntimeError):
    """The client's Python is not the executors' minor version: pyspark cannot run a function."""


@dataclasses.dataclass(frozen=True)
class ExecutorPython:
    """The executors' answer: their Python's version and path, and the ``ASKED`` modules held."""

    python: str
    executable: str
    modules: frozenset[str]


def here() -> ExecutorPython:
    """This process's own answer (what every executor runs)."""
    found = frozenset(m for m in ASKED if importlib.util.find_spec(m) is not None)
    return ExecutorPython(platform.python_version(), sys.executable, found)


def _answer(batches) -> Iterator:
    import pyarrow as pa  # noqa: PLC0415 (on the executor)

    mine = dataclasses.asdict(here())
    yield pa.RecordBatch.from_pylist([{**mine, "modules": ",".join(mine["modules"])}])


_ANSWERS: dict[str, ExecutorPython] = {}  # by Connect session id


def executor_python(spark) -> ExecutorPython:
    """What the executors of ``spark`` hold: asked once per Connect session, ``here()`` else."""
    if not is_connect(spark):
        return here()
    if (known := _ANSWERS.get(spark.session_id)) is not None:
        return known
    try:
        (row,) = spark.range(1, numPartitions=1).mapInArrow(_answer, _SCHEMA).collect()
    except Exception as e:
        if found := _MISMATCH.search(str(e)):
            raise ExecutorPythonMismatch(mismatch_line(found.group(1), found.group(2))) from None
        raise
    modules = frozenset(filter(None, row["modules"].split(",")))
    _ANSWERS[spark.session_id] = answer = ExecutorPython(row["python"], row["executable"], modules)
    return answer


def mismatch_line(executors: str, client: str) -> str:
    """The one line for a client whose Python is not the executors' minor version."""
    executors, client = (".".join(re.findall(r"\d+", v)[:2]) for v in (executors, client))
    use = THIN_CLIENTS.get(executors, f"an environment with Python {executors}")
    return (
        f"this Spark Connect client runs Python {client} and the executors Python {executors}: "
        "pyspark runs a client's functions only on its own minor version; use a client on "
        f"Python {executors} (from a checkout: scripts/setup.sh {use})"
    )


def require_engine(spark, extra: extras.Extra | None, feature: str, instead: str) -> None:
    """Before any rank starts: MissingExtra unless the executors of ``spark`` (None: this
    process) hold ``extra``; over Connect, ExecutorPythonMismatch for another Python."""
    if spark is None or not is_connect(spark):
        return extras.require(extra, feature, instead) if extra is not None else None
    held = executor_python(spark)
    if extra is not None and extra.module not in held.modules:
        raise extras.MissingExtra(
            f"{feature} needs {extra.module} on the executors, and the executors' Python "
            f"{held.python} ({held.executable}) lacks it: "
            f"there, {extra.install}; or use {instead}"
        )
    return None


def default_engine(spark) -> str:
    """Horovod where the executors hold it, else TensorFlow's collectives."""
    return c.HOROVOD if extras.HOROVOD.module in executor_python(spark).modules else c.TF_COLLECTIVE
