"""The classic profile against the current one through ``hvdflow bench``, alternating.

    .venv/bin/python -m studies.profile_bench --model mnist_cnn --rounds 2
    .venv/bin/python -m studies.profile_bench --model digits_mlp --rounds 2

The whole benchmark flow in each profile's environment in turn, its own ``HVDFLOW_HOME``, the
order reversed each round: plain Keras, tf_collective at np=1 and np=2, and (classic) Horovod at
np=2. Steady images/s and final val_accuracy, medians, and current over classic.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

from hvdflow.bench.conditions import Measurement

ROOT = Path(__file__).resolve().parent.parent
PROFILES = {"classic": ROOT / ".venv" / "bin", "current": ROOT / ".venv-current" / "bin"}
COMMON = ["keras", "tf1", "tf2"]
EXTRA = {"classic": ["hvd2"], "current": []}


def bench_once(profile: str, home: Path, args: argparse.Namespace) -> list[Measurement]:
    """One repetition of every condition in ``profile``'s environment; its measurements."""
    env = {**os.environ, "HVDFLOW_HOME": str(home)}
    env.pop("VIRTUAL_ENV", None)
    hvdflow = str(PROFILES[profile] / "hvdflow")
    before = set((home / "benchmarks").glob("*/measurements.json"))
    command = [hvdflow, "bench", "--model", args.model, "--repetitions", "1"]
    command += ["--conditions", ",".join(COMMON + EXTRA[profile]), "--epochs", str(args.epochs)]
    command += ["--images", str(args.images), "--eval-every", "0"]
    try:
        subprocess.run(command, cwd=ROOT, env=env, check=True, stdout=subprocess.DEVNULL)
    finally:
        # The other profile must not share the machine with this one's services.
        subprocess.run([hvdflow, "down"], env=env, check=False, capture_output=True)
    (new,) = set((home / "benchmarks").glob("*/measurements.json")) - before
    return [Measurement(**row) for row in json.loads(new.read_text())]


def _median(values: list[float] | None) -> float | None:
    return statistics.median(values) if values else None


def table(args: argparse.Namespace, rate: dict, accuracy: dict) -> str:
    """Medians per condition and profile, the current profile's ratio, and each profile's
    default engine at np=2 side by side (the pair a user of the pipeline meets)."""
    lines = [
        f"\n{args.model}: steady images/s, final val_accuracy, medians of {args.rounds} round(s)",
        f"  {'condition':<10} {'classic':>9} {'current':>9} {'ratio':>6} {'acc':>7} {'acc':>7}",
    ]
    for condition in COMMON + ["hvd2"]:
        classic, current = (_median(rate.get((p, condition))) for p in PROFILES)
        accs = [_median(accuracy.get((p, condition))) for p in PROFILES]
        ratio = current / classic if classic and current else None
        cells = [f"{v:9.1f}" if v else f"{'-':>9}" for v in (classic, current)]
        cells.append(f"{ratio:6.2f}" if ratio else f"{'-':>6}")
        cells += [f"{a:7.4f}" if a is not None else f"{'-':>7}" for a in accs]
        lines.append(f"  {condition:<10} " + " ".join(cells))
    classic_hvd2 = _median(rate.get(("classic", "hvd2")))
    current_tf2 = _median(rate.get(("current", "tf2")))
    if classic_hvd2 and current_tf2:
        lines.append(
            f"  current tf2 / classic hvd2 (each default engine): {current_tf2 / classic_hvd2:.2f}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="mnist_cnn")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--images", type=int, default=60000)
    parser.add_argument(
        "--homes",
        type=Path,
        default=Path("/tmp/hvdflow-profile-bench"),
        help="one HVDFLOW_HOME per profile under this folder (datasets reused across rounds)",
    )
    args = parser.parse_args(argv)
    if missing := [name for name, b in PROFILES.items() if not (b / "hvdflow").exists()]:
        print(f"needs both profiles' environments: make setup-all (missing: {missing})")
        return 2
    rate: dict[tuple[str, str], list[float]] = {}
    accuracy: dict[tuple[str, str], list[float]] = {}
    for round_ in range(args.rounds):
        # Alternate which profile goes first, so that neither always meets a warmer machine.
        order = list(PROFILES) if round_ % 2 == 0 else list(reversed(PROFILES))
        for profile in order:
            for m in bench_once(profile, args.homes / profile, args):
                rate.setdefault((profile, m.condition), []).append(m.steady_images_per_s)
                accuracy.setdefault((profile, m.condition), []).append(m.final_val_accuracy)
                line = {
                    "round": round_ + 1,
                    "profile": profile,
                    "condition": m.condition,
                    "steady_images_per_s": round(m.steady_images_per_s, 1),
                    "epoch_times": [round(t, 2) for t in m.epoch_times],
                    "val_accuracy": m.final_val_accuracy,
                }
                print(json.dumps(line), flush=True)
    print(table(args, rate, accuracy))
    return 0


if __name__ == "__main__":
    sys.exit(main())
