"""What the runners raise, as classes a user can catch (``from hvdflow import RankFailed``), and
the one-line texts they carry. Each is a ``RuntimeError``, so code written for the originals
(a plain ``Exception`` or ``RuntimeError``) catches them unchanged.
"""

from __future__ import annotations

import logging

from hvdflow.infra.errors import TransientError as TransientError
from hvdflow.infra.launcher import _wire


class RankFailed(RuntimeError):
    """A rank exited non-zero, timed out at start, stalled, was lost or was stopped: ``cause``
    says which (``_wire.CAUSE_*``), ``transient`` whether running again may succeed."""

    cause: str | None = None

    @property
    def transient(self) -> bool:
        return self.cause in _wire.TRANSIENT_CAUSES


class SparkJobFailed(RuntimeError):
    """The Spark job that ran the ranks failed without a rank failure to name (an executor
    lost, the barrier stage aborted). Transient: another attempt may get other executors."""

    transient = True


class EncryptionRequired(RuntimeError):
    """The cluster has ``spark.ssl.enabled`` and the runner's override is not set."""


class GpuSchedulingNotEnabled(RuntimeError):
    """``use_gpu=True`` on a cluster without ``spark.task.resource.<name>.amount``."""


# Headings of what follows a rank failure's first line.
OUTPUT_HEADING = "Last lines of its output:"
STACKS_HEADING = "Python stacks of every rank:"


def headline(error: BaseException) -> str:
    """The first line of ``error``'s message, without the heading of the lines after it."""
    lines = str(error).splitlines()
    first = lines[0] if lines else type(error).__name__
    for heading in (OUTPUT_HEADING, STACKS_HEADING):
        if first.endswith(heading):
            return first[: -len(heading)].rstrip()
    return first


def rank_failed(message: str, cause: str | None) -> RankFailed:
    """``cause`` is set as an attribute so that the error still pickles (Spark carries it)."""
    error = RankFailed(message)
    error.cause = cause
    return error


# --- A failed Spark job's error, in one line a user can act on ---


def first_line(error: BaseException) -> str:
    """The part of a (usually py4j-wrapped) Spark error that says what went wrong."""
    text = str(error).strip()
    if "cancelled" in text.lower():
        return "it was cancelled"
    lines = text.splitlines()
    # A task's Python error: its traceback's last line names it ("PythonException: ... Traceback",
    # in Spark 4 after the barrier stage's own first line).
    for i, line in enumerate(lines):
        if "PythonException:" in line and "Traceback" in line:
            for follow in lines[i + 1 :]:
                if follow and not follow[0].isspace() and ":" in follow:
                    return follow.strip()[:500] + hint(follow)
    useful = [ln for ln in lines if ln.strip() and "An error occurred while calling" not in ln]
    return useful[0].strip()[:500] if useful else type(error).__name__


def hint(error_line: str) -> str:
    if error_line.startswith("ModuleNotFoundError"):
        return (
            " (executors must run a Python with hvdflow and horovod installed: set "
            "PYSPARK_PYTHON, or create the session with hvdflow.infra.spark.get_spark)"
        )
    return ""


# --- A cluster that requires encryption ---
# Gloo's and TensorFlow's collectives are unencrypted: refuse spark.ssl.enabled, as the originals
# do, unless the face's override conf is true.

logger = logging.getLogger(__name__)

SSL_ENABLED = "spark.ssl.enabled"


def conf_boolean(conf, key: str, default: str = "false") -> bool:
    """A boolean Spark conf, read as Scala does: ``true`` or ``false`` in any case."""
    value = str(conf.get(key, default)).strip().lower()
    if value not in ("true", "false"):
        raise ValueError(f"the Spark conf {key}={value!r}: expected true or false")
    return value == "true"


def refuse_unencrypted(conf, who: str, override_key: str) -> None:
    """Raise EncryptionRequired where ``conf`` enables SSL and ``override_key`` is not true."""
    if not conf_boolean(conf, SSL_ENABLED):
        return
    if conf_boolean(conf, override_key):
        logger.warning(
            "%s: this cluster has TLS encryption enabled (%s=true) but %s does not encrypt "
            "its traffic; %s=true overrides that: model parameters and possibly training data "
            "cross the network unencrypted",
            who,
            SSL_ENABLED,
            who,
            override_key,
        )
        return
    raise EncryptionRequired(
        f"this cluster has TLS encryption enabled ({SSL_ENABLED}=true), but {who} does not "
        "encrypt the model parameters and training data its workers exchange. To run anyway, "
        f"set {override_key}=true in the Spark configuration (they will cross the network "
        "unencrypted)"
    )
