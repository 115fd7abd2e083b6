"""Lazy exports for a package's ``__init__``: a name's module is imported on first use.

Rank processes import ``hvdflow.infra.launcher._rank`` and must not pay for Spark or pydantic just
because a package's ``__init__`` re-exports names from modules that import them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from importlib import import_module


def lazy_exports(package: str, exports: Mapping[str, str]) -> Callable[[str], object]:
    """A module ``__getattr__`` that finds ``exports[name]``'s module and returns the name."""

    def __getattr__(name: str) -> object:
        if name in exports:
            return getattr(import_module(exports[name]), name)
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    return __getattr__
