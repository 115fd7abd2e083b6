"""The container tests' engine and images: Docker's engine that scripts/docker.sh finds or
starts, and hvdflow's image of each profile built on it once for the session (from the engine's
cache, outside the clone, when the lock and the code are unchanged)."""

from __future__ import annotations

import json
import os
import secrets
import subprocess
from pathlib import Path

import pytest

from tests.uv import CHECKOUT


def engine_env() -> dict[str, str]:
    """The environment with DOCKER_HOST at an engine that answers (scripts/docker.sh), or skip."""
    found = subprocess.run(
        ["bash", "-c", "source scripts/docker.sh && docker_engine && echo ${DOCKER_HOST:-}"],
        cwd=CHECKOUT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    if found.returncode != 0:
        pytest.skip(f"no Docker engine here: {found.stderr.strip()}")
    host = found.stdout.strip().splitlines()[-1] if found.stdout.strip() else ""
    return os.environ | ({"DOCKER_HOST": host} if host else {})


def docker(env, *args: str, timeout: float = 300, check: bool = True, **kw):
    return subprocess.run(
        ["docker", *args], env=env, capture_output=True, text=True, timeout=timeout,
        check=check, **kw,
    )  # fmt: skip


# The engine's own folder (scripts/docker.sh): what outlives a session beside its images.
ENGINE_ROOT = Path(
    os.environ.get("HVDFLOW_DOCKER_ROOT")
    or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "hvdflow" / "docker"
)


@pytest.fixture(scope="session")
def planted() -> dict[str, str]:
    """Secrets in the builder's environment, drawn once per engine and kept beside its images:
    every layer, whichever session built it, was built with these in the environment, so a
    search of any layer for them means something (a layer cached from a build with other
    secrets would be searched for strings it never saw)."""
    kept = ENGINE_ROOT / "planted-secrets.json"
    if not kept.exists():
        kept.parent.mkdir(parents=True, exist_ok=True)
        token = secrets.token_hex(8)
        kept.write_text(json.dumps(
            {"AWS_SECRET_ACCESS_KEY": f"awsbuild{token}", "MLFLOW_TRACKING_PASSWORD": f"ml{token}"}
        ))  # fmt: skip
    return json.loads(kept.read_text())


def build(profile: str, planted: dict[str, str]) -> tuple[dict, str]:
    """The profile's image, built (from the engine's cache when nothing changed) with secrets in
    the builder's environment; the engine's environment and the image's tag."""
    env = engine_env()
    built = subprocess.run(
        ["bash", "scripts/image.sh", profile], cwd=CHECKOUT, env=env | planted,
        capture_output=True, text=True, timeout=1800,
    )  # fmt: skip
    assert built.returncode == 0, built.stderr[-4000:]
    return env, built.stdout.strip().splitlines()[-1]


@pytest.fixture(scope="session")
def image(planted) -> tuple[dict, str]:
    """The classic image: the engine's environment and the image's tag."""
    return build("classic", planted)


@pytest.fixture(scope="session")
def current_image(planted) -> tuple[dict, str]:
    """The current profile's image (Python 3.13 on Debian trixie)."""
    return build("current", planted)
