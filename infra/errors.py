"""Errors that mean the same thing to every part of hvdflow.

``TransientError`` is public (``from hvdflow import TransientError``): a training function raises
it, or an error raised from one, to say that its failure was temporary.
"""

from __future__ import annotations


class TransientError(RuntimeError):
    """A failure that another attempt may not meet: a service that did not answer, a resource
    that was briefly gone.

    Raised in a rank (by the user's function, or by what it calls: hvdflow's object store raises
    its subclass when the store does not answer), the rank exits with EX_TEMPFAIL and the
    training step runs another attempt from the last checkpoint, up to ``launcher.retries``
    times. Any other exception fails the training at once: it would fail the same way again.
    """

    transient = True
