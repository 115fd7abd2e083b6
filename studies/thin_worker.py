"""The thin Spark Connect worker (``.venv-client``) against the current profile (``.venv-current``):
size on disk, files, and a Connect run's flow imports, the two alternating.

    python -m studies.thin_worker [--rounds 5] [--thin .venv-client] [--full .venv-current]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import tempfile
from pathlib import Path

# What the flow's process of `hvdflow run --spark-master sc://...` imports. Run from a file: the
# Connect client takes a `python -c` __main__ for its own doctests.
IMPORTS = """
import time
started = time.perf_counter()
import hvdflow.flows.prefect.pipeline  # noqa: F401  (Prefect, the steps)
import pyspark.sql.connect.session  # noqa: F401
import mlflow  # noqa: F401
print(time.perf_counter() - started)
"""


def disk(venv: Path) -> tuple[str, int]:
    size = subprocess.run(["du", "-sh", str(venv)], capture_output=True, text=True, check=True)
    files = sum(1 for p in venv.rglob("*") if p.is_file())
    return size.stdout.split()[0], files


def import_seconds(venv: Path, script: Path) -> float:
    out = subprocess.run(
        [str(venv / "bin" / "python"), str(script)],
        capture_output=True,
        text=True,
        check=True,
        cwd=script.parent,  # not the checkout: the installed hvdflow, as a worker has it
    )
    return float(out.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--thin", default=".venv-client")
    parser.add_argument("--full", default=".venv-current")
    args = parser.parse_args(argv)
    venvs = {"thin worker": Path(args.thin).resolve(), "current profile": Path(args.full).resolve()}
    times: dict[str, list[float]] = {name: [] for name in venvs}
    with tempfile.TemporaryDirectory() as scratch:
        script = Path(scratch) / "imports.py"
        script.write_text(IMPORTS)
        for _ in range(args.rounds):
            for name, venv in venvs.items():  # alternating
                times[name].append(import_seconds(venv, script))
    print("| environment | on disk | files | flow imports per round (s) | median (s) |")
    print("|---|---|---|---|---|")
    for name, venv in venvs.items():
        size, files = disk(venv)
        rounds = ", ".join(f"{t:.2f}" for t in times[name])
        median = statistics.median(times[name])
        print(f"| {name} (`{venv.name}`) | {size} | {files:,} | {rounds} | {median:.2f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
