"""hvdflow installs one name, ``hvdflow``, and works beside a user's own ``tasks.py`` and
``flows/``: the wheel's top-level names, the public API, and the package map in pyproject."""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

from tests.helpers import user_project
from tests.wheel import build_wheel

ROOT = Path(__file__).resolve().parent.parent
PUBLIC_API = [
    "HorovodRunner",
    "HorovodOptions",
    "LaunchOptions",
    "MirroredStrategyRunner",
    "TorchDistributor",
    "RankFailed",
    "SparkJobFailed",
    "EncryptionRequired",
    "GpuSchedulingNotEnabled",
    "TransientError",
    "LogLine",
    "log_to_driver",
    "report_progress",
    "get_spark",
    "score_udf",
]


def _setuptools() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]


@pytest.mark.unit
def test_every_room_with_an_init_is_a_listed_package():
    """A new sub-package that pyproject does not list would be missing from the wheel (and
    only from the wheel: the editable install would still find it)."""
    setuptools = _setuptools()
    found = set()
    for package, folder in setuptools["package-dir"].items():
        for init in (ROOT / folder).rglob("__init__.py"):
            if "__pycache__" in init.parts:
                continue
            rel = init.parent.relative_to(ROOT / folder).parts
            found.add(".".join([package, *rel]))
    assert sorted(found) == sorted(setuptools["packages"])


@pytest.mark.unit
def test_the_public_api_is_exported_lazily_from_hvdflow():
    import hvdflow

    assert sorted(hvdflow.__all__) == sorted(PUBLIC_API)
    # Importing the package costs nothing: no Spark, no TensorFlow, no Prefect.
    probe = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys, hvdflow; print(sorted(m for m in sys.modules "
            "if m.split('.')[0] in ('pyspark', 'tensorflow', 'prefect', 'mlflow', 'torch')))",
        ],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    assert probe.stdout.strip() == "[]"
    with pytest.raises(AttributeError, match="has no attribute 'Nope'"):
        hvdflow.Nope  # noqa: B018


@pytest.fixture(scope="module")
def installed_wheel(tmp_path_factory) -> tuple[Path, list[str]]:
    """hvdflow's wheel (``tests.wheel.build_wheel``) installed into a folder of its own: the
    folder and the wheel's files."""
    tmp_path = tmp_path_factory.mktemp("wheel")
    wheel = build_wheel(tmp_path)
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
    target = tmp_path / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(target),
         str(wheel)],
        check=True, capture_output=True, timeout=120,
    )  # fmt: skip
    return target, names


@pytest.mark.unit
def test_type_checkers_see_what_each_lazy_export_is():
    """The exports are lazy, so a type checker sees them only through the TYPE_CHECKING
    imports of ``hvdflow/__init__.py``: one for each export, from the module that serves it."""
    import ast

    import hvdflow

    tree = ast.parse((ROOT / "hvdflow" / "__init__.py").read_text())
    guarded = next(
        node
        for node in tree.body
        if isinstance(node, ast.If) and getattr(node.test, "id", None) == "TYPE_CHECKING"
    )
    seen = {
        alias.name: node.module
        for node in guarded.body
        if isinstance(node, ast.ImportFrom)
        for alias in node.names
    }
    assert seen == hvdflow._EXPORTS


@pytest.mark.unit
@pytest.mark.current
def test_the_profiles_environment_holds_together_as_pip_check_reads_it():
    # The lock, hvdflow's own requirements (the profile's TensorFlow is an extra) and the
    # classic profile's Petastorm build (scripts/petastorm-wheel.sh) agree, with no exception.
    check = subprocess.run(
        [sys.executable, "-m", "pip", "check"], capture_output=True, text=True, timeout=120
    )
    assert check.returncode == 0 and "No broken requirements" in check.stdout, check.stdout


@pytest.mark.integration
@pytest.mark.timeout(300)
@pytest.mark.current
def test_the_wheel_installs_only_hvdflow_and_imports_beside_a_users_tasks_and_flows(
    installed_wheel, tmp_path
):
    target, names = installed_wheel
    top_level = {name.split("/")[0] for name in names if ".dist-info/" not in name}
    assert top_level == {"hvdflow"}
    assert "hvdflow/tasks/score/job.py" in names and "hvdflow/infra/launcher/_rank.py" in names
    project = user_project(tmp_path / "project")
    script = (
        "import flows, tasks, hvdflow, hvdflow.tasks.score.job, hvdflow.flows.prefect.pipeline\n"
        f"from hvdflow import {', '.join(PUBLIC_API)}\n"
        "print(tasks.OWNER, flows.OWNER, sep='|')\n"
        "print(hvdflow.__file__, hvdflow.tasks.score.job.__file__, sep='|')\n"
        "print(HorovodRunner.__module__)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script],
        cwd=project,
        env={"PYTHONPATH": f"{project}:{target}", "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    owners, files, runner_module = done.stdout.strip().splitlines()
    assert owners == "the user|the user"  # the user's modules are still theirs
    assert all(path.startswith(str(target)) for path in files.split("|"))  # ours, from the wheel
    assert runner_module == "hvdflow.infra.launcher.runner"


def documented_studies() -> list[str]:
    """Every ``python -m studies...`` the pages name: the one-off studies, run from a checkout."""
    pages = [ROOT / "README.md", ROOT / "BENCHMARKS.md", *sorted((ROOT / "docs").rglob("*.md"))]
    return sorted(
        {m for page in pages for m in re.findall(r"python -m (studies\.\w+)", page.read_text())}
    )


@pytest.mark.integration
@pytest.mark.timeout(300)
def test_every_study_benchmarks_md_names_starts_from_the_checkout_and_none_ships(installed_wheel):
    """The studies left the wheel (the package keeps what ``hvdflow bench`` runs); each command
    BENCHMARKS.md writes beside its figure still starts where it says: in a checkout."""
    _, names = installed_wheel
    studies = documented_studies()
    on_disk = sorted(f"studies.{p.stem}" for p in (ROOT / "studies").glob("[!_]*.py"))
    assert studies == on_disk  # every study is documented, and every documented one exists
    bench = {Path(name).stem for name in names if name.startswith("hvdflow/bench/")}
    assert bench and bench.isdisjoint(module.split(".")[1] for module in studies)
    assert not any(name.startswith("studies/") for name in names)
    failed = {}
    for module in studies:
        done = subprocess.run(
            [sys.executable, "-m", module, "--help"],
            cwd=ROOT, capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        if done.returncode != 0 or "usage:" not in done.stdout:
            failed[module] = (done.returncode, done.stderr[-1500:])
    assert failed == {}


def documented_modules() -> list[str]:
    """Every ``python -m hvdflow...`` the README, docs/ and BENCHMARKS.md tell a user to run
    (the rank's private entry point, which the launcher runs, is not one)."""
    pages = [ROOT / "README.md", ROOT / "BENCHMARKS.md", *sorted((ROOT / "docs").rglob("*.md"))]
    found = {
        module
        for page in pages
        for module in re.findall(r"python -m (hvdflow(?:\.\w+)*)", page.read_text())
        if not any(part.startswith("_") for part in module.split("."))
    }
    return sorted(found | {"hvdflow"})


@pytest.mark.integration
@pytest.mark.timeout(300)
@pytest.mark.current
def test_every_documented_python_m_starts_from_the_installed_wheel(installed_wheel, tmp_path):
    target, _ = installed_wheel
    modules = documented_modules()
    assert "hvdflow.airflow" in modules  # the walk finds what the pages name
    failed = {}
    for module in modules:
        # No checkout on the path: the wheel, and the environment's other packages.
        done = subprocess.run(
            [sys.executable, "-m", module, "--help"],
            cwd=tmp_path,
            env={"PYTHONPATH": str(target), "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)},
            capture_output=True,
            text=True,
            timeout=120,
        )
        if done.returncode != 0 or "usage:" not in done.stdout:
            failed[module] = (done.returncode, done.stderr[-1500:])
    assert failed == {}
