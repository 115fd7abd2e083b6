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


def rank_failed(message: str, cause: str | None) -> RankFailed:
    """A ``RankFailed`` with its ``cause``, set as an attribute so that the exception still
    pickles (Spark carries a task's exception back to the driver)."""
    error = RankFailed(message)
    error.cause = cause
    return error
