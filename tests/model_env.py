"""A fresh virtual environment holding a registered model's own requirements, and nothing else.

What a registry consumer without hvdflow has: ``python -m venv`` plus ``pip install -r`` of the
model's ``requirements.txt``. Built once per set of requirements into
``~/.cache/hvdflow/test-envs`` (outside the clone: about 3 minutes and 2 GB the first time),
under a file lock, and marked complete only when pip finished.
"""

from __future__ import annotations

import fcntl
import hashlib
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path.home() / ".cache" / "hvdflow" / "test-envs"
COMPLETE = ".complete"


def model_env(requirements: Path) -> Path:
    """The environment for ``requirements`` (a requirements.txt): its folder."""
    text = requirements.read_text()
    digest = hashlib.sha256(f"{sys.version_info[:2]}\n{text}".encode()).hexdigest()[:16]
    env = ROOT / f"model-{digest}"
    ROOT.mkdir(parents=True, exist_ok=True)
    with open(ROOT / f"model-{digest}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (env / COMPLETE).exists():
            return env
        shutil.rmtree(env, ignore_errors=True)  # a build that died half way
        subprocess.run([sys.executable, "-m", "venv", str(env)], check=True)
        pip = [str(env / "bin" / "python"), "-m", "pip", "--disable-pip-version-check", "-q"]
        subprocess.run([*pip, "install", "-r", str(requirements)], check=True, timeout=1200)
        (env / COMPLETE).write_text(text)
    return env
