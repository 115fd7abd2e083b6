"""scripts/gpu-check.sh, the GPU check that waits for a lent GPU machine, run here on the CPU at
its tiny sizes: in an environment like that machine's (a Python with PyTorch, numpy and pyarrow,
no hvdflow installed, none of its other dependencies), and with the Keras trainer here."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from importlib.metadata import version

import pytest

from tests.uv import CHECKOUT, run_cached_first, uv, uv_env

pytestmark = pytest.mark.slow
SCRIPT = str(CHECKOUT / "scripts" / "gpu-check.sh")


def _check(tmp_path, python: str, *args: str) -> tuple[dict, str]:
    out = tmp_path / "gpu-check.json"
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    done = subprocess.run(
        ["bash", SCRIPT, "--tiny", "--out", str(out), *args],
        env=env | {"PYTHON": python},
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return json.loads(out.read_text()), done.stdout


def _conditions(figures: dict) -> list[tuple[str, str, int]]:
    return [(r["framework"], r["model"], r["ranks"]) for r in figures["rows"]]


def test_the_torch_trainer_runs_where_only_torch_numpy_and_pyarrow_are_installed(tmp_path):
    pytest.importorskip("torch", reason="torch is not installed (the classic profile has it)")
    venv = tmp_path / "device-like"
    env = uv_env() | {"UV_COMPILE_BYTECODE": "0"}  # a throwaway venv: no bytecode to compile
    subprocess.run([uv(), "venv", "-q", "-p", sys.executable, str(venv)], check=True, env=env)
    # What the GPU machines hold (device/KINDS.md) and hvdflow's trainer needs; nothing else.
    pins = [f"{name}=={version(name)}" for name in ("torch", "numpy", "pyarrow")]
    install = [uv(), "pip", "install", "-q", "-p", str(venv / "bin" / "python"), *pins]
    run_cached_first(install, check=True, env=env)

    # VGG16 alone, as for Keras below: the torch trainer's CNN at 1 and 2 ranks is trained in
    # tests/training and tests/flows (the check's other rows are the same code at other sizes).
    # --input: VGG16 fed from a raw split through hvdflow's stream, real and emulated AU.
    figures, printed = _check(
        tmp_path,
        str(venv / "bin" / "python"),
        "--frameworks",
        "torch",
        "--models",
        "vgg16",
        "--input",
    )

    assert _conditions(figures) == [("torch", "vgg16", 1), ("torch", "vgg16", 2)]
    assert all(r["images_per_s"] > 0 and len(r["epoch_times_s"]) == 2 for r in figures["rows"])
    assert figures["machine"]["gpus"] == 0 and figures["machine"]["tensorflow"] is None
    assert "| torch | vgg16 | 32x32x3 | 2 | CPU |" in printed
    [fed] = figures["input"]
    assert fed["model"] == "vgg16" and fed["batch"] == 8 and fed["step_ms"] > 0
    assert 0 < fed["au_real"] <= 1 and 0 < fed["au_emulated"] <= 1, fed
    assert "AU" in printed and "real" in printed and "emulated" in printed


def test_the_keras_trainer_runs_at_one_rank_and_on_the_tf_collective_engine(tmp_path):
    pytest.importorskip("tensorflow")
    # VGG16 alone: the Keras trainer's CNN at 1 and 2 ranks is trained all through the suite.
    figures, printed = _check(
        tmp_path, sys.executable, "--frameworks", "tensorflow", "--models", "vgg16"
    )
    assert _conditions(figures) == [("tensorflow", "vgg16", 1), ("tensorflow", "vgg16", 2)]
    two = figures["rows"][-1]
    assert two["images_per_s_per_rank"] * 2 == pytest.approx(two["images_per_s"])
    assert "| tensorflow | vgg16 | 32x32x3 | 2 | CPU |" in printed
