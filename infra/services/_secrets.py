"""The embedded services' generated secrets: made once, kept in files only their owner reads.

Every secret a service needs (keys, passwords, the auth string) is generated at its first start
and kept in a file of mode 0600 in that service's home, so a restart keeps the same credentials
and clients can be pointed at the file instead of being shown the value. Nothing here logs or
returns a secret in a message.
"""

from __future__ import annotations

import json
import os
import secrets
from collections.abc import Callable
from pathlib import Path

# Owner read/write only: the mode of every file that holds a secret.
PRIVATE_MODE = 0o600


def new_secret() -> str:
    """A random secret: 32 bytes, URL-safe (no '%', ':' or quotes to escape in ini, toml or
    an ``user:password`` string)."""
    return secrets.token_urlsafe(32)


def write_private(path: Path, text: str | bytes) -> None:
    """Write ``path`` with mode 0600, replacing it whole (a reader never sees half a file).

    The file is created 0600 before anything is written to it, so the secret is never
    readable by others, not even for a moment; an older file with a wider mode is replaced.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.partial")
    fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, PRIVATE_MODE)
    try:
        os.fchmod(fd, PRIVATE_MODE)  # O_CREAT's mode does not apply to a file left from before
        data = text.encode() if isinstance(text, str) else text
        with os.fdopen(fd, "wb") as f:
            f.write(data)
    except BaseException:
        partial.unlink(missing_ok=True)
        raise
    os.replace(partial, path)


def load_or_create_json(path: Path, create: Callable[[], dict[str, str]]) -> dict[str, str]:
    """The JSON object in ``path``; on first use, ``create()``'s, written there with mode 0600."""
    if path.exists():
        return json.loads(path.read_text())
    values = create()
    write_private(path, json.dumps(values, indent=2) + "\n")
    return values
