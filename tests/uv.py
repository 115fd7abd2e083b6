"""uv as the project's scripts run it (scripts/uv.sh, scripts/uv-env.sh), for the tests that
resolve or install packages."""

from __future__ import annotations

import functools
import os
import subprocess
import sys
from pathlib import Path

CHECKOUT = Path(__file__).resolve().parent.parent


@functools.cache
def uv() -> str:
    """The path of the uv the set-up uses (installed once into a cache when missing)."""
    return subprocess.run(
        ["bash", str(CHECKOUT / "scripts" / "uv.sh")], check=True, capture_output=True, text=True
    ).stdout.strip()


def uv_env() -> dict[str, str]:
    """This environment for a uv child: it never downloads Python, compiles what it installs,
    works on the environment it is told rather than this one (VIRTUAL_ENV), and finds what pip's
    find-links hold (where a CPU machine keeps PyTorch's CPU build)."""
    env = {k: v for k, v in os.environ.items() if k != "VIRTUAL_ENV"}
    env["UV_PYTHON_DOWNLOADS"] = "never"
    env["UV_COMPILE_BYTECODE"] = "1"  # as scripts/uv-env.sh says why
    links = env.get("UV_FIND_LINKS") or env.get("PIP_FIND_LINKS")
    if not links:
        links = subprocess.run(
            [sys.executable, "-m", "pip", "config", "get", "global.find-links"],
            capture_output=True, text=True,
        ).stdout  # fmt: skip
    if links.split():
        env["UV_FIND_LINKS"] = ",".join(links.split())
    return env


def run_cached_first(command: list[str], **kwargs) -> subprocess.CompletedProcess:
    """Runs a uv command from uv's cache alone (``--offline``), and online only when that fails.

    These tests pin or prefer versions uv has already fetched. Online, behind a proxy that strips
    cache headers (this machine's), each run downloaded pyspark's 450 MB source again and kept it
    unpacked as a new cache entry: 4 GB a suite run, until the disk filled.
    """
    offline = subprocess.run([*command, "--offline"], **{**kwargs, "check": False})
    if offline.returncode == 0:
        return offline
    return subprocess.run(command, **kwargs)
