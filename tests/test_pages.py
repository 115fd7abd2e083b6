"""The pages stay pages: the README a front page, BENCHMARKS.md a headline, docs/testing.md how to
run the tests, and no table cell a page of its own (issue #77). Links on the front pages resolve."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
DOCS = ROOT / "docs"
KB = 1024
# The pages whose every link is checked here: the README and the pages written beside it.
LINKED_PAGES = ["README.md", "docs/status.md", "docs/testing.md", "docs/layout.md"]


def table_cells(text: str) -> list[tuple[int, str]]:
    """Every cell of every Markdown table in ``text``, as (line number, stripped text): a table
    row is a line that starts with ``|``; cells are split on the pipes that are not escaped."""
    cells = []
    for number, line in enumerate(text.splitlines(), 1):
        row = line.strip()
        if not row.startswith("|"):
            continue
        parts = re.split(r"(?<!\\)\|", row)[1:]
        if row.endswith("|") and not row.endswith("\\|"):
            parts = parts[:-1]
        cells.extend((number, part.strip()) for part in parts)
    return cells


def long_cells(path: Path, limit: int) -> list[str]:
    return [
        f"{path.relative_to(ROOT)}:{number}: {len(cell)} characters: {cell[:60]}..."
        for number, cell in table_cells(path.read_text())
        if len(cell) > limit
    ]


def anchors(text: str) -> set[str]:
    """The anchors GitHub makes for a page's headings: lower case, punctuation dropped, spaces
    to hyphens, a repeated one numbered."""
    seen: dict[str, int] = {}
    found = set()
    in_code = False
    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            in_code = not in_code
        heading = re.match(r"#{1,6}\s+(.*?)\s*#*\s*$", line)
        if in_code or not heading:
            continue
        slug = re.sub(r"[^\w\- ]", "", heading.group(1).lower()).replace(" ", "-")
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        found.add(slug if count == 0 else f"{slug}-{count}")
    return found


def broken_links(path: Path) -> list[str]:
    """The relative links of a page whose file, or whose anchor in a Markdown page, is missing."""
    text = re.sub(r"```.*?```", "", path.read_text(), flags=re.S)
    problems = []
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"[a-z]+:", target):
            continue  # https:, mailto:
        file, _, anchor = target.partition("#")
        linked = (path.parent / file).resolve() if file else path
        if not linked.exists():
            problems.append(f"{target}: no such file")
        elif anchor and linked.suffix == ".md" and anchor not in anchors(linked.read_text()):
            problems.append(f"{target}: no such heading")
    return problems


def test_the_readme_is_a_front_page():
    text = README.read_text()
    assert len(text.splitlines()) <= 200, f"README.md has {len(text.splitlines())} lines"
    assert len(text.encode()) <= 12 * KB, f"README.md has {len(text.encode())} bytes"
    assert long_cells(README, 200) == []


def test_the_readmes_first_screen_says_how_to_run_install_and_use_it():
    first_screen = "\n".join(README.read_text().splitlines()[:40])
    for words in ("make run", "make test", "pip install", "HorovodRunner("):
        assert words in first_screen, f"README.md's first 40 lines do not say {words!r}"


def test_benchmarks_md_is_a_headline_page():
    lines = (ROOT / "BENCHMARKS.md").read_text().splitlines()
    assert len(lines) <= 250, f"BENCHMARKS.md has {len(lines)} lines"


def test_the_benchmark_detail_pages_stay_within_60_kb():
    sizes = {p.name: p.stat().st_size for p in sorted((DOCS / "benchmarks").glob("*.md"))}
    assert sum(sizes.values()) <= 60 * KB, f"docs/benchmarks/*.md: {sizes}"


def test_the_testing_page_stays_within_150_lines():
    lines = (DOCS / "testing.md").read_text().splitlines()
    assert len(lines) <= 150, f"docs/testing.md has {len(lines)} lines"


def test_the_layout_page_is_a_map_read_in_minutes():
    lines = (DOCS / "layout.md").read_text().splitlines()
    assert len(lines) <= 150, f"docs/layout.md has {len(lines)} lines"


def test_no_table_cell_under_docs_is_over_300_characters():
    assert [cell for page in sorted(DOCS.rglob("*.md")) for cell in long_cells(page, 300)] == []


@pytest.mark.parametrize("page", LINKED_PAGES)
def test_every_link_on_the_front_pages_resolves(page):
    assert broken_links(ROOT / page) == []


def test_the_checks_read_tables_anchors_and_links(tmp_path):
    cells = table_cells("text | not a row\n| a | `x \\| y` |\n|---|---|\n  | b | c\n")
    assert [cell for _, cell in cells] == ["a", "`x \\| y`", "---", "---", "b", "c"]
    headings = "# A page\n## What works, and what does not yet\n## `hvdflow status`\n## A page\n"
    assert anchors(headings + "```\n# a comment\n```\n") == {
        "a-page",
        "what-works-and-what-does-not-yet",
        "hvdflow-status",
        "a-page-1",
    }
    (tmp_path / "other.md").write_text("# Other\n\n## Its part\n")
    page = tmp_path / "page.md"
    page.write_text(
        "[ok](other.md#its-part) [web](https://example.org/x) [here](#top)\n"
        "[gone](missing.md) [wrong](other.md#no-part)\n```\n[in code](nowhere.md)\n```\n# Top\n"
    )
    assert broken_links(page) == ["missing.md: no such file", "other.md#no-part: no such heading"]
