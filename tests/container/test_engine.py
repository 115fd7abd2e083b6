"""Where no Docker engine answers and none can be started, the image's build says in one line
how to get one (scripts/docker.sh, which scripts/image.sh and the container tests use)."""

from __future__ import annotations

import subprocess

import pytest

from tests.uv import CHECKOUT

pytestmark = pytest.mark.unit


def test_no_engine_and_no_dockerd_is_one_line_saying_how_to_get_one(tmp_path):
    # A PATH with neither docker nor dockerd on it, and a socket nothing listens on.
    env = {"PATH": str(tmp_path), "HVDFLOW_DOCKER_ROOT": str(tmp_path / "docker")}
    found = subprocess.run(
        ["/bin/bash", "-c", "source scripts/docker.sh && docker_engine"],
        cwd=CHECKOUT, env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert found.returncode == 1
    (line,) = found.stderr.strip().splitlines()
    assert line.startswith(f"no Docker engine answers (DOCKER_HOST=unix://{tmp_path}/docker/")
    assert "dockerd is not installed" in line and "bash scripts/setup.sh docker" in line
