"""The training function and its arguments as the bytes every rank unpickles.

cloudpickle sends ``main`` by value, with what it captures; when something cannot be pickled,
the error names that argument, captured variable or global instead of cloudpickle's internals.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import cloudpickle


def pickle_payload(main: Callable[..., Any], kwargs: dict[str, Any]) -> bytes:
    if not callable(main):
        raise ValueError(f"main={main!r}: expected a function to run on every rank")
    try:
        return cloudpickle.dumps((main, kwargs))
    except Exception as e:
        raise ValueError(
            f"main cannot be sent to the ranks: {unpicklable_part(main, kwargs)} cannot be "
            f"pickled ({type(e).__name__}: {e}). Create it inside main, or pass something "
            "picklable instead (a path, a config)."
        ) from e


def unpicklable_part(main: Callable[..., Any], kwargs: dict[str, Any]) -> str:
    """Name the argument, captured variable or global that cloudpickle chokes on."""

    def fails(value: Any) -> bool:
        try:
            cloudpickle.dumps(value)
            return False
        except Exception:
            return True

    for key, value in kwargs.items():
        if fails(value):
            return f"keyword argument {key!r} ({type(value).__name__})"
    code = getattr(main, "__code__", None)
    if code is not None:
        for name, cell in zip(code.co_freevars, main.__closure__ or (), strict=False):
            value = cell.cell_contents
            if fails(value):
                return f"variable {name!r} ({type(value).__name__}) that main captures"
        module_globals = getattr(main, "__globals__", {})
        for name in code.co_names:
            if name in module_globals and fails(module_globals[name]):
                return f"global {name!r} ({type(module_globals[name]).__name__}) that main uses"
    return f"main ({main!r})"
