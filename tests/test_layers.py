"""The layers import only downwards: flows > bench > tasks > training > infra > serving; inside
tasks, the image inputs that preprocessing and scoring share sit below both."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parent.parent
LAYERS = ["serving", "infra", "training", "tasks", "bench", "flows"]  # lowest first


def imported_packages(path: Path) -> set[str]:
    """hvdflow's layers that ``path`` imports (``hvdflow.<layer>...``), at module level or inside
    functions."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        else:
            continue
        for name in names:
            parts = name.split(".")
            if parts[0] == "hvdflow" and len(parts) > 1 and parts[1] in LAYERS:
                found.add(parts[1])
    return found


def imported_task_rooms(path: Path) -> set[str]:
    """The rooms of the tasks layer (``hvdflow.tasks.<room>``) that ``path`` imports."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [f"{node.module}.{alias.name}" for alias in node.names]
        else:
            continue
        for name in names:
            parts = name.split(".")
            if parts[:2] == ["hvdflow", "tasks"] and len(parts) > 2:
                found.add(parts[2])
    return found


def upward_imports() -> list[str]:
    problems = []
    for rank, layer in enumerate(LAYERS):
        higher = set(LAYERS[rank + 1 :])
        for path in sorted((ROOT / layer).rglob("*.py")):
            for package in sorted(imported_packages(path) & higher):
                problems.append(f"{path.relative_to(ROOT)} imports {package}")
    return problems


def test_no_module_imports_from_a_higher_layer():
    assert upward_imports() == []


def test_the_check_sees_an_upward_import(tmp_path):
    module = tmp_path / "m.py"
    module.write_text(
        "def f():\n    from hvdflow.bench.conditions import measure\nimport hvdflow.infra.spark\n"
    )
    assert imported_packages(module) == {"bench", "infra"}


def test_the_image_inputs_sit_below_preprocessing_and_scoring():
    """What both steps read images with (listing, fetching, decoding, the quarantine) is
    ``hvdflow.tasks.images``: it imports no other room of tasks, and scoring borrows nothing
    from preprocessing's room."""
    problems = []
    for path in sorted((ROOT / "tasks" / "images").rglob("*.py")):
        for room in sorted(imported_task_rooms(path) - {"images"}):
            problems.append(f"{path.relative_to(ROOT)} imports hvdflow.tasks.{room}")
    for path in sorted((ROOT / "tasks" / "score").rglob("*.py")):
        if "preprocess" in imported_task_rooms(path):
            problems.append(f"{path.relative_to(ROOT)} imports hvdflow.tasks.preprocess")
    assert problems == []


def test_the_check_sees_a_room_of_tasks(tmp_path):
    module = tmp_path / "m.py"
    module.write_text(
        "from hvdflow.tasks import images\n"
        "def f():\n    import hvdflow.tasks.preprocess.job\n"
        "from hvdflow.tasks.score.inputs import Unit\nimport hvdflow.infra.spark\n"
    )
    assert imported_task_rooms(module) == {"images", "preprocess", "score"}
