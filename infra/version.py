"""hvdflow's installed version, read when asked for.

importlib.metadata costs a tenth of a second, which `hvdflow --help` and every rank process would
otherwise pay at import. Here, below every layer, so that a step can record the version without
importing the top-level package (an arrow back up).
"""

from __future__ import annotations


def package_version() -> str:
    """The installed distribution's version; ``0+unknown`` from a source tree never installed."""
    from importlib.metadata import PackageNotFoundError, version  # noqa: PLC0415

    try:
        return version("hvdflow")
    except PackageNotFoundError:
        return "0+unknown"
