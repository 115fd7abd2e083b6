"""hvdflow's wheel, built as a user would get it, without touching the checkout."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def package_dirs() -> dict[str, str]:
    """pyproject's map of installed package to folder of the checkout."""
    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    return setuptools["package-dir"]


def build_wheel(tmp_path: Path) -> Path:
    """hvdflow's wheel, built from a copy of what the sdist would hold (so the checkout gets no
    build/ folder): its path, under ``tmp_path``."""
    source = tmp_path / "source"
    for name in ["pyproject.toml", "README.md", *package_dirs().values()]:
        if (ROOT / name).is_dir():
            shutil.copytree(
                ROOT / name, source / name, ignore=shutil.ignore_patterns("__pycache__")
            )
        else:
            source.mkdir(exist_ok=True)
            shutil.copy(ROOT / name, source / name)
    wheels = tmp_path / "wheels"
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
         "-w", str(wheels), str(source)],
        check=True, capture_output=True, timeout=240,
    )  # fmt: skip
    (wheel,) = wheels.glob("hvdflow-*.whl")
    return wheel
