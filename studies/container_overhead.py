"""hvdflow's image against the host: the image's size, a rebuild after a change of hvdflow's
code, and the pipeline (`hvdflow run`) in a container against the same run on the host, the two
alternating against the same object store, MLflow and Prefect servers.

    .venv/bin/python -m studies.container_overhead [--rounds 3] [--np 2] [--epochs 2]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def timed(command: list[str], **kw) -> float:
    started = time.perf_counter()
    subprocess.run(command, check=True, capture_output=True, **kw)
    return time.perf_counter() - started


def rebuild_after_a_change(env: dict) -> float:
    """scripts/image.sh on a copy of the checkout whose code differs by one line."""
    with tempfile.TemporaryDirectory(prefix="hvdflow-image-") as scratch:
        copy = Path(scratch) / "checkout"
        shutil.copytree(ROOT, copy, ignore=shutil.ignore_patterns(".venv*", ".git", "build"))
        with (copy / "hvdflow" / "__init__.py").open("a") as f:
            f.write(f"# changed {time.time()}\n")
        python = {"IMAGE_PYTHON": str(ROOT / ".venv" / "bin" / "python")}
        return timed(["bash", str(copy / "scripts" / "image.sh"), "classic"], env=env | python)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--np", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=2)
    args = parser.parse_args(argv)
    from hvdflow.infra.services.local import LocalServices  # noqa: PLC0415 (lazy: Prefect)

    found = subprocess.run(
        ["bash", "-c", "source scripts/docker.sh && docker_engine && echo ${DOCKER_HOST:-}"],
        cwd=ROOT, capture_output=True, text=True, check=True,
    )  # fmt: skip
    env = os.environ | {"DOCKER_HOST": found.stdout.split()[-1]}
    timed(["bash", "scripts/image.sh", "classic"], cwd=ROOT, env=env)  # the image, current
    rebuild = rebuild_after_a_change(env)
    size = subprocess.run(
        ["docker", "image", "inspect", "-f", "{{.Size}}", "hvdflow:classic"],
        env=env, capture_output=True, text=True, check=True,
    )  # fmt: skip
    with contextlib.ExitStack() as stack:
        home = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="hvdflow-home-")))
        services = LocalServices(home)
        stack.callback(services.down)
        run_env = env | services.up(prefect=True) | {"HVDFLOW_HOME": str(home)}
        variables = [a for k, v in run_env.items() if k.startswith(("AWS_", "MLFLOW_", "PREFECT_"))
                     for a in ("-e", f"{k}={v}")]  # fmt: skip
        run = ["hvdflow", "run", "--np", str(args.np), "--epochs", str(args.epochs)]
        ways = {
            "host": [str(ROOT / ".venv" / "bin" / "hvdflow"), *run[1:]],
            "container": [
                "docker",
                "run",
                "--rm",
                "--network",
                "host",
                *variables,
                "hvdflow:classic",
                *run,
            ],  # fmt: skip
        }
        times: dict[str, list[float]] = {way: [] for way in ways}
        for round_ in range(args.rounds):
            for way in ways if round_ % 2 == 0 else reversed(ways):
                times[way].append(timed(ways[way], env=run_env))
                print(f"  round {round_ + 1} {way:>9}: {times[way][-1]:.1f} s", flush=True)
    host, container = (statistics.median(times[w]) for w in ("host", "container"))
    print(
        f"\nimage hvdflow:classic: {int(size.stdout) / 1e9:.2f} GB; "
        f"rebuilt after a change of hvdflow's code in {rebuild:.1f} s"
    )
    print(f"hvdflow run --np {args.np} --epochs {args.epochs}, median of {args.rounds}:")
    print(f"  host {host:.1f} s, container {container:.1f} s: {container / host:.2f}x the host")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
