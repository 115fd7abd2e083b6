"""Change this process's environment for a while, and put it back."""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager


@contextmanager
def temporary_env(values: Mapping[str, str]) -> Iterator[None]:
    """Set ``values`` in ``os.environ``; restore what was there (or its absence) afterwards."""
    saved = {key: os.environ.get(key) for key in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
