"""Walking one local class folder: every file once, and what cannot be read, with the reason.

Broken links, link loops and folder cycles, unlistable folders and named pipes (opening one
waits forever) are listed as problems to quarantine, instead of failing the listing or never
ending. Links that resolve are followed; a folder reached twice is listed once, under its first
path. Order: ``os.walk``'s with sorted names, depth first; names starting with a dot are skipped.
"""

from __future__ import annotations

import errno
import os
import stat
from typing import NamedTuple

PERMISSION_DENIED_FOLDER = "permission denied: the folder cannot be listed (chmod a+rx it)"
PERMISSION_DENIED_ENTRY = "permission denied: it cannot be looked at (chmod a+x its folder)"
_SPECIAL_FILES = (
    (stat.S_ISFIFO, "a named pipe"),
    (stat.S_ISSOCK, "a socket"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
)


class Found(NamedTuple):
    """A file to decode (``problem`` None; ``size`` and ``mtime_ns`` its own, links followed),
    or an entry that cannot be one, and why."""

    path: str
    size: int = 0
    mtime_ns: int = 0
    problem: str | None = None


def walk_class_folder(folder: str, root: str) -> list[Found]:
    """Everything under ``folder`` (a class folder of the input folder ``root``), in order."""
    root_id = _identity(os.stat(root))
    try:
        top = _identity(os.stat(folder))
    except OSError as e:
        return [Found(folder, problem=_stat_problem(folder, e))]
    if top == root_id:
        return [Found(folder, problem=_loop(folder))]
    found: list[Found] = []
    listed = {top: folder}  # folder identity -> the first path it was walked at
    stack = [(folder, (root_id, top))]  # a folder to walk, and its own and its parents' ids
    while stack:
        path, ancestors = stack.pop()
        subfolders = []
        for entry in _entries(path, found):
            result = _look_at(entry, ancestors, listed, root)
            if isinstance(result, Found):
                found.append(result)
            else:
                subfolders.append((entry, (*ancestors, result)))
        stack.extend(reversed(subfolders))
    return found


def _entries(path: str, found: list[Found]) -> list[str]:
    """The sorted paths in a folder, not dotted ([] and a problem in ``found`` if unlistable)."""
    try:
        names = os.listdir(path)
    except PermissionError:
        found.append(Found(path, problem=PERMISSION_DENIED_FOLDER))
        return []
    except OSError as e:
        found.append(Found(path, problem=f"cannot list the folder: {e.strerror}"))
        return []
    return [os.path.join(path, name) for name in sorted(names) if not name.startswith(".")]


def _look_at(path: str, ancestors, listed: dict, root: str) -> Found | tuple[int, int]:
    """A file or a problem (Found), or the identity of a sub-folder to walk."""
    try:
        info = os.stat(path)
    except OSError as e:
        return Found(path, problem=_stat_problem(path, e))
    if stat.S_ISDIR(info.st_mode):
        identity = _identity(info)
        if identity in ancestors:
            return Found(path, problem=_loop(path))
        if identity in listed:
            first = os.path.relpath(listed[identity], root)
            return Found(
                path,
                problem=f"a second path to the folder {first!r}: its files are listed once, "
                "under that path",
            )
        listed[identity] = path
        return identity
    for is_kind, kind in _SPECIAL_FILES:
        if is_kind(info.st_mode):
            return Found(path, problem=f"not a regular file but {kind}: it is never read")
    return Found(path, info.st_size, info.st_mtime_ns)


def _stat_problem(path: str, error: OSError) -> str:
    target = _link_target(path)
    if error.errno == errno.ELOOP:
        return (
            f"symbolic link loop: it points to {target!r}, and following the links never "
            "reaches a file"
        )
    if isinstance(error, FileNotFoundError) and target is not None:
        return f"broken symbolic link: it points to {target!r}, which does not exist"
    if isinstance(error, PermissionError):
        return PERMISSION_DENIED_ENTRY
    return f"cannot look at it: {error.strerror}"


def _loop(path: str) -> str:
    target = _link_target(path)
    if target is None:  # a bind mount, not a link
        return "folder loop: it is a folder that contains it"
    return f"symbolic link loop: it points to {target!r}, a folder that contains it"


def _link_target(path: str) -> str | None:
    try:
        return os.readlink(path)
    except OSError:
        return None


def _identity(info: os.stat_result) -> tuple[int, int]:
    return info.st_dev, info.st_ino
