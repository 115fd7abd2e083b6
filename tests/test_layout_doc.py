"""docs/layout.md tells the truth: every room (a package folder) has its entry in the Folders
block, and every module of a room is named in that room's entry."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parent.parent
ROOMS = ["hvdflow", "serving", "flows", "tasks", "bench", "training", "infra", "studies"]
# An entry's first line: its name at the margin (a top room) or two spaces in (inside the room
# above), then the description. A name ending in "/" is a folder; another is a module's own line.
_ENTRY = re.compile(r"^( {0,2})(\S+)(?:\s+|$)")


def entries(text: str) -> dict[str, str]:
    """The Folders block as {folder path: the words of its entry}; a module's own line (such as
    ``  spark.py``) belongs to the folder above it."""
    block = text.split("## Folders", 1)[1].split("```", 2)[1]
    found: dict[str, str] = {}
    top = current = None
    for line in block.splitlines():
        match = _ENTRY.match(line)
        if match and match.group(2).endswith("/"):
            name = match.group(2)
            if not match.group(1):
                top = current = name
            else:
                current = f"{top}{name}"
            found[current] = line[match.end() :]
        elif match and match.group(1) and top is not None:  # a module's own line, in its room
            current = top
            found[current] += " " + line
        elif current is not None:
            found[current] += " " + line
    return found


def missing_from(layout: str, root: Path = ROOT, rooms=ROOMS) -> list[str]:
    described = entries(layout)
    problems = []
    for room in rooms:
        for init in sorted((root / room).rglob("__init__.py")):
            folder = init.parent.relative_to(root).as_posix() + "/"
            if folder not in described:
                problems.append(f"{folder} has no entry")
                continue
            words = set(re.findall(r"[A-Za-z_][A-Za-z0-9_]*", described[folder]))
            for module in sorted(init.parent.glob("*.py")):
                stem = module.stem
                if stem not in ("__init__", "__main__") and not {stem, stem.lstrip("_")} & words:
                    problems.append(f"{folder}{module.name} is not named in {folder}'s entry")
    return problems


def test_docs_layout_names_every_room_and_module():
    assert missing_from((ROOT / "docs" / "layout.md").read_text()) == []


def test_the_check_sees_a_missing_module_and_a_missing_room(tmp_path):
    for path in ("pkg/__init__.py", "pkg/alpha.py", "pkg/_beta.py", "pkg/sub/__init__.py"):
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text("")
    layout = "## Folders\n\n```\npkg/     alpha (the first),\n         and beta\n```\n"
    assert missing_from(layout, tmp_path, ["pkg"]) == ["pkg/sub/ has no entry"]
    layout = "## Folders\n\n```\npkg/     alpha\n  sub/   nothing yet\n```\n"
    assert missing_from(layout, tmp_path, ["pkg"]) == ["pkg/_beta.py is not named in pkg/'s entry"]


def public_api_named(layout: str) -> set[str]:
    """The names the page's public API list gives: each bullet's backticked names."""
    section = layout.split("## The public API", 1)[1].split("\n## ", 1)[0]
    bullets = re.split(r"\n- ", section.split("\n- ", 1)[1])
    return {name for bullet in bullets for name in re.findall(r"`(\w+)`", bullet.split(":")[0])}


def test_docs_layout_lists_exactly_the_public_api():
    import hvdflow

    named = public_api_named((ROOT / "docs" / "layout.md").read_text())
    assert named == set(hvdflow.__all__)


def test_the_api_check_reads_each_bullets_names_before_its_colon():
    page = "## The public API\n\nIntro.\n\n- `A`, `B`: the `C` of it\n- `D`\n  `E`: more\n\n## X\n"
    assert public_api_named(page) == {"A", "B", "D", "E"}
    page = page.replace("- `D`", "- `D`, `F`")
    assert public_api_named(page) == {"A", "B", "D", "E", "F"}
