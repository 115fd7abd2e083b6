"""A fresh virtual environment holding a registered model's own requirements, and nothing else.

What a registry consumer without hvdflow has: a new venv plus ``pip install -r`` of the model's
``requirements.txt``, here done by uv (the same resolution, from the cache the profiles share:
seconds and hardlinks where pip took about 3 minutes and 2 GB the first time). Built once per set
of requirements into ``~/.cache/hvdflow/test-envs`` (outside the clone), under a file lock, and
marked complete only when the install finished.
"""

from __future__ import annotations

import fcntl
import hashlib
import shutil
import subprocess
import sys
from pathlib import Path

from tests.uv import run_cached_first, uv, uv_env

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
        env_vars = uv_env()  # only the model's requirements: nothing of this environment's
        venv = [uv(), "venv", "--quiet", "--python", sys.executable, str(env)]
        subprocess.run(venv, check=True, env=env_vars)
        run_cached_first(
            [uv(), "pip", "install", "--quiet", "--python", str(env / "bin" / "python"),
             "-r", str(requirements)],
            check=True, timeout=1200, env=env_vars,
        )  # fmt: skip
        (env / COMPLETE).write_text(text)
    return env
