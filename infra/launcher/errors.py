"""What the runners raise, as classes a user can catch: ``from hvdflow.infra.launcher.errors
import RankFailed`` (or ``from hvdflow import RankFailed``).

The originals raise a plain ``Exception`` or ``RuntimeError`` where these say which failure it
was; each is a ``RuntimeError``, so code written for the originals catches them unchanged.
"""

from __future__ import annotations

# What a training function raises to ask for another attempt: here beside what the runners
# raise, defined below every layer (the object store raises it too).
from hvdflow.infra.errors import TransientError as TransientError
from hvdflow.infra.launcher import _wire


class RankFailed(RuntimeError):
    """A rank exited non-zero, timed out at start, stalled, was lost or was stopped.

    ``cause`` says which (one of ``_wire``'s ``CAUSE_*``); ``transient`` whether running again
    may succeed (a killed process, a lost host, a stall) rather than fail the same way.
    """

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
    """``use_gpu=True`` on a cluster without ``spark.task.resource.<name>.amount`` (the
    original raises a plain ``Exception`` here: this is one, and says more)."""


# The headings of what follows the first line of a rank's failure: its last lines of output,
# or every rank's Python stacks after a stall.
OUTPUT_HEADING = "Last lines of its output:"
STACKS_HEADING = "Python stacks of every rank:"


def headline(error: BaseException) -> str:
    """The first line of ``error``'s message without the heading of the lines after it: what a
    one-line record of the failure shows ("training attempt 1 of 3 failed (...)")."""
    lines = str(error).splitlines()
    first = lines[0] if lines else type(error).__name__
    for heading in (OUTPUT_HEADING, STACKS_HEADING):
        if first.endswith(heading):
            return first[: -len(heading)].rstrip()
    return first


def rank_failed(message: str, cause: str | None) -> RankFailed:
    """A ``RankFailed`` with its ``cause``, set as an attribute so that the exception still
    pickles (Spark carries a task's exception back to the driver)."""
    error = RankFailed(message)
    error.cause = cause
    return error
