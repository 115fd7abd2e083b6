"""Which failures read as a full disk, wherever they were raised."""

from __future__ import annotations

import errno

import pytest

from hvdflow.infra.errors import DiskFullError, TransientError, is_disk_full

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
    assert issubclass(DiskFullError, TransientError)


def test_the_driver_names_a_full_disk_first_when_a_rank_ends_with_one():
    from hvdflow.infra.launcher._decisions import error_line

    tail = [
        "[1,0]<stderr>:    raise DiskFullError(",
        "[1,0]<stderr>:hvdflow.infra.errors.DiskFullError: checkpoint epoch-0006 could not be "
        "written: no space left on device in /tmp/r0/ckpt (written here before it is uploaded)",
    ]
    assert error_line(tail).startswith("DiskFullError: checkpoint epoch-0006 could not be written")
