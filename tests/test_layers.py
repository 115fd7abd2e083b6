"""The layers import only downwards: flows > bench > tasks > training > infra > serving, and none
imports the top-level package (it sits above them all); inside tasks, the image inputs that
preprocessing and scoring share sit below both; the steps know no orchestrator."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parent.parent
LAYERS = ["serving", "infra", "training", "tasks", "bench", "flows"]  # lowest first
# The top-level package (``import hvdflow``): its lazy exports reach into every layer.
TOP = "hvdflow"
# The orchestrators, which only their faces under flows/ may import or name.
ORCHESTRATORS = re.compile(r"prefect|airflow", re.IGNORECASE)


def imported_packages(path: Path) -> set[str]:
    """hvdflow's layers that ``path`` imports (``hvdflow.<layer>...``), at module level or inside
    functions; ``hvdflow`` itself for an import of the top-level package or its exports."""
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
            elif parts[0] == "hvdflow":
                found.add(TOP)
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


# Airflow's example DAG file is a template that users copy into their dags folder: it imports
# hvdflow as their own code does, and nothing in the package imports it.
USER_TEMPLATES = {ROOT / "flows" / "airflow" / "example_dags.py"}


def upward_imports() -> list[str]:
    problems = []
    for rank, layer in enumerate(LAYERS):
        higher = {*LAYERS[rank + 1 :], TOP}
        for path in sorted(set((ROOT / layer).rglob("*.py")) - USER_TEMPLATES):
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
    module.write_text("import hvdflow\n")
    assert imported_packages(module) == {TOP}
    module.write_text("from hvdflow import HorovodRunner\n")
    assert imported_packages(module) == {TOP}


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


def orchestrator_mentions(root: Path) -> list[str]:
    """Each line of a module under ``root`` that names an orchestrator: an import, a string, a
    comment or a docstring alike (a step that says "Prefect" has begun to know it)."""
    found = []
    for path in sorted(root.rglob("*.py")):
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if ORCHESTRATORS.search(line):
                found.append(f"{path.relative_to(root.parent)}:{number}: {line.strip()}")
    return found


def test_the_steps_know_no_orchestrator():
    """tasks/ holds the steps as plain functions; Prefect's and Airflow's wrappers are their
    faces under flows/ (docs/layout.md)."""
    assert orchestrator_mentions(ROOT / "tasks") == []


def test_the_orchestrator_check_sees_an_import_and_a_word(tmp_path):
    room = tmp_path / "tasks"
    room.mkdir()
    (room / "a.py").write_text("from prefect import task\n")
    (room / "b.py").write_text('"""Runs as an Airflow task."""\nx = 1\n')
    (room / "c.py").write_text("x = 'plain'\n")
    assert orchestrator_mentions(room) == [
        "tasks/a.py:1: from prefect import task",
        'tasks/b.py:1: """Runs as an Airflow task."""',
    ]
