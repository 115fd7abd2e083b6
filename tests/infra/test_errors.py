"""Which failures read as a full disk, wherever they were raised."""

from __future__ import annotations

import errno

import pytest

from hvdflow.infra.errors import DiskFull, TransientError, is_disk_full

pytestmark = pytest.mark.unit


def test_a_full_disk_is_recognised_raised_here_from_elsewhere_or_in_a_task_s_text():
    assert is_disk_full(OSError(errno.ENOSPC, "No space left on device"))
    # Spark carries a task's Python error back as text inside the driver's exception.
    carried = RuntimeError("PythonException: ...\nOSError: [Errno 28] No space left on device")
    assert is_disk_full(carried)
    try:
        try:
            raise OSError(errno.ENOSPC, "No space left on device")
        except OSError as e:
            raise ValueError("writing failed") from e
    except ValueError as outer:
        assert is_disk_full(outer)


def test_other_write_failures_are_not_a_full_disk():
    assert not is_disk_full(OSError(errno.EACCES, "Permission denied"))
    assert not is_disk_full(OSError(errno.EDQUOT, "Disk quota exceeded"))
    assert not is_disk_full(RuntimeError("the task failed"))


def test_a_full_disk_asks_for_another_attempt():
    assert issubclass(DiskFull, TransientError)
