"""Errors that mean the same thing to every part of hvdflow.

``TransientError`` is public (``from hvdflow import TransientError``): a training function raises
it, or an error raised from one, to say that its failure was temporary. ``DiskFullError`` is one.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Iterator
from contextlib import contextmanager


class TransientError(RuntimeError):
    """A failure that another attempt may not meet: a service that did not answer, a resource
    that was briefly gone.

    Raised in a rank, the rank exits with EX_TEMPFAIL and the training step runs another attempt
    from the last checkpoint, up to ``launcher.retries`` times. Any other exception fails the
    training at once: it would fail the same way again.
    """

    transient = True


class DiskFullError(TransientError):
    """A write that found its disk full. Transient: space another process held may be free by
    the next attempt; the message names what was being written, where, and how to make room."""


@contextmanager
def disk_full_as(message: str) -> Iterator[None]:
    """A full disk met inside (``is_disk_full``) raised as a DiskFullError with ``message``;
    anything else as it was."""
    try:
        yield
    except Exception as e:
        if not is_disk_full(e):
            raise
        raise DiskFullError(message) from e


def is_disk_full(error: BaseException) -> bool:
    """Whether ``error``, or an error it was raised from, is a full disk (ENOSPC): an OSError
    here, TensorFlow's ResourceExhausted over a file write, or a Spark task's Python error
    carried back in the text of the driver's exception."""
    seen: set[int] = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if isinstance(error, OSError) and error.errno == errno.ENOSPC:
            return True
        if _NO_SPACE in str(error):
            return True
        error = error.__cause__ or error.__context__
    return False


_NO_SPACE = os.strerror(errno.ENOSPC)  # "No space left on device"
