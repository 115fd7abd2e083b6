"""A rank's folder on its executor: the payload, the result, the stacks file, and the rank's
own temporary files (its TMPDIR). It goes when the task ends; a task killed with its executor
cannot remove it, so each new one first removes the folders of tasks whose process has ended.
The folder's name carries its task's pid and host name: a pid says nothing about a folder that
another host (a container with its own process numbers) left in a shared temporary folder."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import socket
import tempfile
from collections.abc import Iterator

PREFIX = "hvdflow-rank"
# tempfile's random part: 8 characters of [a-z0-9_].
_OWNER = re.compile(rf"^{PREFIX}\d+-pid(\d+)@(.+)-[a-z0-9_]{{8}}$")


@contextlib.contextmanager
def rank_workdir(rank: int) -> Iterator[str]:
    remove_orphans()
    prefix = f"{PREFIX}{rank}-pid{os.getpid()}@{socket.gethostname()}-"
    with tempfile.TemporaryDirectory(prefix=prefix) as path:
        yield path


def remove_orphans(base: str | None = None) -> list[str]:
    """Removes the rank folders in ``base`` (the temporary folder) whose task process has
    ended; the paths removed."""
    base = base or tempfile.gettempdir()
    here = socket.gethostname()
    removed = []
    with contextlib.suppress(OSError):
        for name in os.listdir(base):
            owner = _OWNER.match(name)
            if owner and owner.group(2) == here and not _alive(int(owner.group(1))):
                shutil.rmtree(os.path.join(base, name), ignore_errors=True)
                removed.append(os.path.join(base, name))
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's process
    return True
