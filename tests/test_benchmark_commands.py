"""Every command the benchmark pages (BENCHMARKS.md, docs/benchmarks/*.md) write beside a figure
still runs as written: its study or harness module exists and its command line parses (its
own argparse parser, in a subprocess that stops right after parsing), ``hvdflow bench`` and the
other ``hvdflow`` commands parse as the CLI parses them (the benchmark's parameters validated as
``hvdflow bench`` validates them), ``make`` targets are the Makefile's, the scripts and test files
named exist. Also the pages' own limits: the headline page's length and its one table, the detail
pages' size, table cells, and links that resolve."""

from __future__ import annotations

import argparse
import os
import re
import shlex
import subprocess
import sys
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
HEADLINE = ROOT / "BENCHMARKS.md"
DETAIL = sorted((ROOT / "docs" / "benchmarks").glob("*.md"))
PAGES = [HEADLINE, *DETAIL]

MAX_HEADLINE_LINES = 250
MAX_DETAIL_BYTES = 60 * 1024
MAX_CELL_CHARS = 300

_FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.M | re.S)
_INLINE = re.compile(r"`([^`\n]+)`")
_ENV = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")


@dataclass(frozen=True)
class Command:
    page: str
    kind: str  # module, pytest, hvdflow, make, file
    target: str  # the module, the make target or the file
    args: tuple[str, ...]

    def __str__(self) -> str:
        return f"{self.page}: {self.target} {shlex.join(self.args)}"


def _command_lines(text: str) -> list[str]:
    """Shell lines of the page's bash blocks (continuations joined) and the inline code of its
    table rows (where the figures' commands stand)."""
    lines = []
    for lang, body in _FENCE.findall(text):
        if lang in ("bash", "sh", ""):
            lines += body.replace("\\\n", " ").splitlines()
    without_blocks = _FENCE.sub("", text)
    for row in without_blocks.splitlines():
        if row.startswith("|"):
            lines += _INLINE.findall(row)
    return lines


def _classify(page: str, tokens: list[str]) -> Command | None:
    while tokens and _ENV.match(tokens[0]):
        tokens = tokens[1:]  # VAR=value before the command
    if not tokens:
        return None
    program, rest = Path(tokens[0]).name, tokens[1:]
    if program == "make":
        targets = [t for t in rest if not t.startswith("-") and "=" not in t]
        return Command(page, "make", " ".join(targets), ())
    if program == "bash" and rest and rest[0].endswith(".sh"):
        return Command(page, "file", rest[0], tuple(rest[1:]))
    if program.startswith("python"):
        if len(rest) >= 2 and rest[0] == "-m":
            module, args = rest[1], tuple(rest[2:])
            if module == "pytest":
                return Command(page, "pytest", module, args)
            if module.split(".")[0] in ("studies", "tests", "hvdflow"):
                return Command(page, "module", module, args)
        if rest and rest[0].endswith(".py"):
            return Command(page, "file", rest[0], tuple(rest[1:]))
        return None
    if program == "hvdflow":
        return Command(page, "hvdflow", "hvdflow", tuple(rest))
    return None


def page_commands(page: Path) -> list[Command]:
    found = []
    name = str(page.relative_to(ROOT))
    for line in _command_lines(page.read_text()):
        try:
            tokens = shlex.split(line, comments=True)
        except ValueError as e:
            raise AssertionError(f"{name}: a command that does not split: {line!r} ({e})") from e
        while tokens:  # `a && b`: each on its own
            cut = tokens.index("&&") if "&&" in tokens else len(tokens)
            command = _classify(name, tokens[:cut])
            if command is not None:
                found.append(command)
            tokens = tokens[cut + 1 :]
    return found


def all_commands() -> list[Command]:
    return [command for page in PAGES for command in page_commands(page)]


def of_kind(kind: str) -> list[Command]:
    return [command for command in all_commands() if command.kind == kind]


@pytest.mark.unit
def test_the_pages_write_commands_of_every_kind_they_use():
    """The walk finds what the pages name (a walk that found nothing would prove nothing)."""
    commands = all_commands()
    kinds = {command.kind for command in commands}
    assert {"module", "hvdflow", "make", "file", "pytest"} <= kinds
    modules = {c.target for c in commands if c.kind == "module"}
    assert {"studies.launch_overhead", "studies.torch_distributor", "tests.soak"} <= modules
    assert any(c.kind == "hvdflow" and c.args[:1] == ("bench",) for c in commands)
    # One made-up study the walk must see, and the check below would refuse.
    fake = page_commands_from_text("```bash\n.venv/bin/python -m studies.no_such_study --x 1\n```")
    assert fake == [Command("<text>", "module", "studies.no_such_study", ("--x", "1"))]
    assert not _module_file("studies.no_such_study").exists()


def page_commands_from_text(text: str) -> list[Command]:
    found = []
    for line in _command_lines(text):
        command = _classify("<text>", shlex.split(line, comments=True))
        if command is not None:
            found.append(command)
    return found


def _module_file(module: str) -> Path:
    path = ROOT.joinpath(*module.split("."))
    return path / "__main__.py" if path.is_dir() else path.with_suffix(".py")


@pytest.mark.unit
def test_every_study_and_harness_module_a_page_runs_is_in_the_checkout():
    missing = [
        str(c)
        for c in of_kind("module")
        if not c.target.startswith("hvdflow.") and not _module_file(c.target).is_file()
    ]
    assert missing == []


@pytest.mark.unit
def test_every_script_and_test_file_a_page_names_exists():
    files = [c.target for c in of_kind("file")]
    files += [arg for c in of_kind("pytest") for arg in c.args if not arg.startswith("-")]
    assert files  # scripts/gpu-check.sh, scripts/gpu_reference.py, tests/cluster/...
    assert [f for f in files if not (ROOT / f.split("::")[0]).is_file()] == []


@pytest.mark.unit
def test_every_make_target_a_page_names_is_the_makefiles():
    makefile = (ROOT / "Makefile").read_text()
    defined = set(re.findall(r"^([A-Za-z][\w-]*)\s*:(?!=)", makefile, re.M))
    named = {target for c in of_kind("make") for target in c.target.split()}
    assert named and named - defined == set()


def _cli_parser() -> argparse.ArgumentParser:
    from hvdflow.flows.cli import build_parser

    return build_parser()


def _parse_cli(args: tuple[str, ...]) -> argparse.Namespace | None:
    """The parsed command line; None for a request for help (``--help``)."""
    try:
        return _cli_parser().parse_args(list(args))
    except SystemExit as e:  # argparse's way of answering --help (0), or of refusing
        if e.code == 0:
            return None
        raise AssertionError(f"hvdflow {shlex.join(args)}: the CLI refuses it") from e


@pytest.mark.unit
def test_every_hvdflow_command_parses_and_every_bench_command_makes_valid_parameters(tmp_path):
    from hvdflow.flows.cli import BENCH_FLAGS
    from hvdflow.flows.cli_support import nested_params
    from hvdflow.flows.params import BenchParams

    commands = of_kind("hvdflow")
    benches = 0
    for command in commands:
        args = _parse_cli(command.args)
        if args is None or args.command != "bench":
            continue
        benches += 1
        if args.input == "DIR":  # a placeholder for the user's folder: an existing one here
            args.input = str(tmp_path)
        if args.conditions:  # as `hvdflow bench` reads them
            args.conditions = args.conditions.split(",")
        nested_params(BenchParams, args, BENCH_FLAGS)  # raises InvalidParameters, naming it
    assert benches >= 5  # the study, time to accuracy, the GCN, ... (the pages' main figures)
    with pytest.raises(AssertionError, match="refuses"):
        _parse_cli(("bench", "--no-such-flag"))


# Runs a module's __main__ with argparse stopped right after parsing: its imports and its
# parser run, its measurement does not.
_PARSE_ONLY = """
import argparse, runpy, sys
real = argparse.ArgumentParser.parse_args
def parse_only(self, args=None, namespace=None):
    real(self, args, namespace)
    print("HVDFLOW-PARSED", flush=True)
    raise SystemExit(0)
argparse.ArgumentParser.parse_args = parse_only
sys.argv = [sys.argv[1], *sys.argv[2:]]
runpy.run_module(sys.argv[0], run_name="__main__", alter_sys=True)
print("HVDFLOW-NOT-PARSED", flush=True)
"""


def _parse_in_subprocess(module: str, args: tuple[str, ...]) -> tuple[int, str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | {"PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-c", _PARSE_ONLY, module, *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    return done.returncode, done.stdout + done.stderr


@pytest.mark.integration
@pytest.mark.timeout(900)
def test_every_study_and_harness_command_on_the_pages_parses_as_written():
    by_module: dict[str, set[tuple[str, ...]]] = defaultdict(set)
    for command in of_kind("module"):
        if command.target.split(".")[0] in ("studies", "tests"):
            by_module[command.target].add(command.args)
    runs = [(module, args) for module, argsets in sorted(by_module.items()) for args in argsets]
    assert len(by_module) >= 10
    with ThreadPoolExecutor(2) as pool:
        results = list(pool.map(lambda run: _parse_in_subprocess(*run), runs))
    failed = {
        f"{module} {shlex.join(args)}": output[-1500:]
        for (module, args), (code, output) in zip(runs, results, strict=True)
        if code != 0 or "HVDFLOW-PARSED" not in output
    }
    assert failed == {}
    # And the check fails where it should: a flag the parser does not know.
    code, output = _parse_in_subprocess("studies.launch_overhead", ("--no-such-flag",))
    assert code != 0 and "HVDFLOW-PARSED" not in output and "unrecognized" in output


# --- the pages' own limits -------------------------------------------------------------------


def _table_rows(text: str) -> list[list[str]]:
    text = _FENCE.sub("", text)
    return [
        [cell.strip() for cell in re.split(r"(?<!\\)\|", line.strip())[1:-1]]
        for line in text.splitlines()
        if line.startswith("|")
    ]


@pytest.mark.unit
def test_the_headline_page_is_short_and_opens_with_one_table_whose_rows_name_their_command():
    text = HEADLINE.read_text()
    assert len(text.splitlines()) <= MAX_HEADLINE_LINES
    first_table = text.split("\n|", 1)[1].split("\n\n", 1)[0]
    rows = _table_rows("|" + first_table)
    header, rows = rows[0], rows[2:]
    assert header == ["what", "ours", "the peer or limit", "ratio", "machine", "command"]
    assert len(rows) >= 10
    for row in rows:
        assert len(row) == len(header), row
        commands = page_commands_from_text(f"| {row[-1]} |")
        assert commands, f"no command in the row {row[0]!r}: {row[-1]!r}"
    # The detail pages are linked from the headline page, each one.
    for page in DETAIL:
        assert f"docs/benchmarks/{page.name}" in text, page.name


@pytest.mark.unit
def test_the_detail_pages_fit_and_no_table_cell_is_a_paragraph():
    assert DETAIL and sum(p.stat().st_size for p in DETAIL) <= MAX_DETAIL_BYTES
    long = {
        f"{page.name}: {cell[:60]}...": len(cell)
        for page in PAGES
        for row in _table_rows(page.read_text())
        for cell in row
        if len(cell) > MAX_CELL_CHARS
    }
    assert long == {}


def _anchors(page: Path) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation dropped, spaces to hyphens."""
    headings = re.findall(r"^#+\s+(.*)$", _FENCE.sub("", page.read_text()), re.M)
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-") for h in headings}


@pytest.mark.unit
def test_every_link_and_image_on_the_pages_resolves():
    broken = []
    for page in PAGES:
        text = _FENCE.sub("", page.read_text())
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"^[a-z]+://", target):
                continue
            path, _, anchor = target.partition("#")
            resolved = (page.parent / path).resolve() if path else page
            if not resolved.exists():
                broken.append(f"{page.name}: {target} (no such file)")
            elif anchor and resolved.suffix == ".md" and anchor not in _anchors(resolved):
                broken.append(f"{page.name}: {target} (no such heading)")
    assert broken == []
    # The plots of the paper's study stand on the pages.
    shown = " ".join(page.read_text() for page in PAGES)
    for plot in (ROOT / "docs" / "benchmarks").glob("*.png"):
        assert plot.name in shown, plot.name
