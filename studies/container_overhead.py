"""A profile's image against the host: the image's size, a build without the layer cache (uv's
cache mount kept) and a rebuild after a change of hvdflow's code, and the pipeline (`hvdflow
run`) in a container against the same run on the host, the two alternating against the same
object store, MLflow and Prefect servers.

    .venv/bin/python -m studies.container_overhead [--profile classic|current] [--rounds 3]
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


VENVS = {"classic": ".venv", "current": ".venv-current"}


def rebuild_after_a_change(env: dict, profile: str) -> float:
    """scripts/image.sh on a copy of the checkout whose code differs by one line."""
    with tempfile.TemporaryDirectory(prefix="hvdflow-image-") as scratch:
        copy = Path(scratch) / "checkout"
        shutil.copytree(ROOT, copy, ignore=shutil.ignore_patterns(".venv*", ".git", "build"))
        with (copy / "hvdflow" / "__init__.py").open("a") as f:
            f.write(f"# changed {time.time()}\n")
        python = {"IMAGE_PYTHON": str(ROOT / VENVS[profile] / "bin" / "python")}
        return timed(["bash", str(copy / "scripts" / "image.sh"), profile], env=env | python)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profile", choices=list(VENVS), default="classic")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--np", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=2)
    args = parser.parse_args(argv)
    from hvdflow.infra.services.local import LocalServices  # noqa: PLC0415 (lazy: Prefect)

    found = subprocess.run(
        ["bash", "-c", "source scripts/docker.sh && docker_engine && echo ${DOCKER_HOST:-}"],
        cwd=ROOT, capture_output=True, text=True, check=True,
    )  # fmt: skip
    tag, venv = f"hvdflow:{args.profile}", ROOT / VENVS[args.profile]
    env = os.environ | {"DOCKER_HOST": found.stdout.split()[-1]}
    env["IMAGE_PYTHON"] = f"{venv}/bin/python"
    image = ["bash", "scripts/image.sh", args.profile]
    cold = timed(image, cwd=ROOT, env=env | {"HVDFLOW_IMAGE_NO_CACHE": "1"})
    rebuild = rebuild_after_a_change(env, args.profile)
    size = subprocess.run(
        ["docker", "image", "inspect", "-f", "{{.Size}}", tag],
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
            "host": [str(venv / "bin" / "hvdflow"), *run[1:]],
            "container": [
                "docker",
                "run",
                "--rm",
                "--network",
                "host",
                *variables,
                tag,
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
        f"\nimage {tag}: {int(size.stdout) / 1e9:.2f} GB; built without the layer cache in "
        f"{cold:.0f} s, rebuilt after a change of hvdflow's code in {rebuild:.1f} s"
    )
    print(f"hvdflow run --np {args.np} --epochs {args.epochs}, median of {args.rounds}:")
    print(f"  host {host:.1f} s, container {container:.1f} s: {container / host:.2f}x the host")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
