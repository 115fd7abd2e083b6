"""A soak over both profiles: each profile's runs on a stack of its own (cluster, services,
worker, deployments, Airflow), one profile after the other, merged into one table and record.

The profile of the Python that runs ``python -m tests.soak`` runs its runs in this process;
another profile's run in that profile's Python (``.venv-current/bin/python -m tests.soak
--phase PLAN``), which writes its records as JSON for this process to read. A Python runs
the Spark, TensorFlow and services of its own profile only, which is why the parts do not
share a stack."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from tests.soak.plan import CLASSIC, CURRENT, PlannedRun
from tests.soak.runner import IdleCheck, RunRecord

ROOT = Path(__file__).resolve().parents[2]
PYTHONS = {CLASSIC: ROOT / ".venv/bin/python", CURRENT: ROOT / ".venv-current/bin/python"}
STACK_PACKAGES = (
    "pyspark",
    "tensorflow",
    "tensorflow-cpu",
    "torch",
    "horovod",
    "mlflow",
    "prefect",
)


@dataclass
class Part:
    """What one profile's runs left: their records and the checks between them, and the stack
    they ran on."""

    profile: str
    records: list[RunRecord] = field(default_factory=list)
    idle: list[IdleCheck] = field(default_factory=list)
    scoring: dict = field(default_factory=dict)
    airflow_scoring: dict = field(default_factory=dict)
    final_leftovers: list[str] = field(default_factory=list)
    harness_errors: list[str] = field(default_factory=list)
    stack: dict = field(default_factory=dict)
    wall_s: float = 0.0

    def bad(self) -> bool:
        """Whether something after the runs went wrong: the scoring runs, what was left, or the
        harness itself (a part that wrote no record is one)."""
        return bool(
            self.scoring.get("state") != "COMPLETED"
            or self.scoring.get("problems")
            or self.airflow_scoring.get("problems")
            or self.final_leftovers
            or self.harness_errors
        )


def this_profile() -> str:
    """The classic profile where Horovod is installed (``.venv``), else the current one."""
    from hvdflow.infra import constants as c
    from hvdflow.tasks.config import default_engine

    return CLASSIC if default_engine() == c.HOROVOD else CURRENT


def run(plan: list[PlannedRun], workdir: Path, epochs: int) -> list[Part]:
    """Each profile's runs of ``plan`` in the plan's order, each on a stack of its own."""
    parts = []
    for profile in dict.fromkeys(p.profile for p in plan):
        mine = [p for p in plan if p.profile == profile]
        where = workdir / profile if len({p.profile for p in plan}) > 1 else workdir
        if profile == this_profile():
            parts.append(run_here(mine, where, epochs))
        else:
            parts.append(run_elsewhere(profile, mine, where, epochs))
    return parts


def run_here(plan: list[PlannedRun], workdir: Path, epochs: int) -> Part:
    from tests.cluster.spark_cluster import netns_spark_cluster
    from tests.soak.session import run_soak

    started = time.time()
    with netns_spark_cluster(
        workdir / "cluster", workers=2, cores=1, spare=1, kind="bench", timeout_s=300
    ) as cluster:
        soak = run_soak(cluster, workdir, plan, epochs, score_in_airflow=True)
    return Part(
        profile=this_profile(),
        records=soak.records,
        idle=soak.idle,
        scoring=soak.scoring,
        airflow_scoring=soak.airflow_scoring,
        final_leftovers=soak.final_leftovers,
        harness_errors=soak.harness_errors,
        stack=stack_versions(),
        wall_s=time.time() - started,
    )


def run_elsewhere(profile: str, plan: list[PlannedRun], workdir: Path, epochs: int) -> Part:
    """The runs in ``profile``'s Python, which writes its part to a file this reads back. A
    part that wrote nothing is a harness error that names the command and its exit."""
    python = PYTHONS[profile]
    workdir.mkdir(parents=True, exist_ok=True)
    plan_file, part_file = workdir / "plan.json", workdir / "part.json"
    write_plan(plan, plan_file)
    part_file.unlink(missing_ok=True)
    command = [str(python), "-m", "tests.soak", "--phase", str(plan_file)]
    command += ["--epochs", str(epochs), "--workdir", str(workdir), "--json", str(part_file)]
    if not python.exists():
        return Part(profile, harness_errors=[f"no {python}: run `make setup PROFILE={profile}`"])
    print(f"\nsoak: the {profile} profile's {len(plan)} runs: {' '.join(command)}", flush=True)
    exit_code = subprocess.run(command, cwd=ROOT, check=False).returncode
    if not part_file.exists():
        return Part(profile, harness_errors=[f"{' '.join(command)} exited {exit_code}: no part"])
    return read_part(part_file)


def write_part(part: Part, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(asdict(part), indent=2, default=str))


def read_part(path: Path) -> Part:
    data = json.loads(path.read_text())
    records = []
    for r in data.pop("records"):
        records.append(RunRecord(**{**r, "planned": PlannedRun(**r["planned"])}))
    idle = [IdleCheck(**c) for c in data.pop("idle")]
    return Part(records=records, idle=idle, **data)


def write_plan(plan: list[PlannedRun], path: Path) -> None:
    path.write_text(json.dumps([asdict(p) for p in plan], indent=2))


def read_plan(path: Path) -> list[PlannedRun]:
    return [PlannedRun(**p) for p in json.loads(path.read_text())]


def stack_versions() -> dict:
    """What a part ran on: its Python's packages (the cluster runs the same environment)."""
    from importlib.metadata import PackageNotFoundError, version

    from hvdflow.tasks.config import default_engine

    found = {"python": sys.version.split()[0], "engine": default_engine()}
    for name in STACK_PACKAGES:
        try:
            found[name] = version(name)
        except PackageNotFoundError:
            pass
    return found
