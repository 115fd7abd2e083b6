"""The locks and the ranges: each profile's lock is what pyproject.toml compiles to, and the
ranges admit the stacks a team brings (not only the two the project locks).

They ask the package index through uv (scripts/uv.sh), as a maintainer's `make lock` does.
"""

from __future__ import annotations

import subprocess

import pytest

from tests.uv import run_cached_first, uv, uv_env
from tests.wheel import ROOT

pytestmark = pytest.mark.integration


def test_every_lock_is_what_pyproject_and_its_in_file_compile_to():
    check = subprocess.run(
        ["bash", str(ROOT / "scripts" / "lock.sh"), "--check"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert check.returncode == 0, check.stderr[-3000:]


def resolve(tmp_path, python: str, *requirements: str) -> dict[str, str]:
    """What the wheel's ranges with its ``tensorflow`` extra resolve to beside ``requirements``
    on ``python``: name -> version."""
    wanted = tmp_path / "wanted.txt"
    wanted.write_text("\n".join(requirements) + "\n")
    compiled = run_cached_first(
        [uv(), "pip", "compile", "--quiet", "--no-header", "--no-annotate",
         str(ROOT / "pyproject.toml"), str(wanted), "--extra", "tensorflow",
         "--python-version", python, "--python-platform", "x86_64-manylinux_2_28"],
        capture_output=True, text=True, timeout=300, env=uv_env(),
    )  # fmt: skip
    assert compiled.returncode == 0, compiled.stderr[-3000:]
    return dict(line.split("==", 1) for line in compiled.stdout.split() if "==" in line)


def major_minor(version: str) -> tuple[int, int]:
    major, minor = version.split(".")[:2]
    return int(major), int(minor)


def test_a_python_311_team_on_current_tensorflow_and_numpy_2_can_install_hvdflow(tmp_path):
    # Before the ranges said `tensorflow` on every Python, 3.11 meant tensorflow-cpu 2.15, whose
    # numpy<2 made this unsatisfiable.
    pins = resolve(tmp_path, "3.11", "numpy>=2", "tensorflow>=2.18")
    assert major_minor(pins["numpy"]) >= (2, 0)
    assert major_minor(pins["tensorflow"]) >= (2, 18)
    assert pins["tf-keras"].split(".")[:2] == pins["tensorflow"].split(".")[:2]
    assert "horovod" not in pins and "tensorflow-cpu" not in pins


def test_a_python_313_team_on_pyarrow_18_and_numpy_2_can_install_hvdflow(tmp_path):
    pins = resolve(tmp_path, "3.13", "numpy>=2", "pyarrow>=18")
    assert major_minor(pins["numpy"]) >= (2, 0)
    assert major_minor(pins["pyarrow"]) >= (18, 0)
