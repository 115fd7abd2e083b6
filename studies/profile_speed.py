"""The classic profile against the current one: hvdflow's Keras trainer, side by side, alternating.

The same training function (``training.trainer``, the pipeline's) on the same synthetic images
(``studies.gpu_check``'s workloads, no Spark), in each profile's own interpreter in turn, round
by round: one process on every core (plain Keras: TensorFlow's own speed) and two ranks on the
tf_collective engine, one core each. Steady images/s (the epochs after the first), and the
current profile's against the classic one's: where the two-rank ratio is no worse than the
one-process ratio, the gap is TensorFlow's own.

    .venv/bin/python -m studies.profile_speed --rounds 2
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROFILES = {
    "classic": ROOT / ".venv" / "bin" / "python",
    "current": ROOT / ".venv-current" / "bin" / "python",
}


def one_round(python: Path, models: str) -> list[dict]:
    """gpu_check's Keras rows (1 and 2 ranks) in ``python``'s profile."""
    with tempfile.NamedTemporaryFile(suffix=".json") as out:
        command = [str(python), "-m", "studies.gpu_check", "--frameworks", "tensorflow"]
        command += ["--models", models, "--ranks", "2", "--out", out.name]
        subprocess.run(command, cwd=ROOT, check=True, stdout=subprocess.DEVNULL)
        return json.loads(Path(out.name).read_text())["rows"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--models", default="mnist_cnn,digits_mlp")
    args = parser.parse_args(argv)
    if missing := [name for name, python in PROFILES.items() if not python.exists()]:
        print(f"needs both profiles' environments: make setup-all (missing: {missing})")
        return 2
    seen: dict[tuple[str, str, int], list[float]] = {}
    for round_ in range(args.rounds):
        # Alternate which profile goes first, so that neither always meets a warmer machine.
        order = list(PROFILES) if round_ % 2 == 0 else list(reversed(PROFILES))
        for profile in order:
            for row in one_round(PROFILES[profile], args.models):
                key = (profile, row["model"], row["ranks"])
                seen.setdefault(key, []).append(row["images_per_s"])
                line = {"round": round_ + 1, "profile": profile, **row}
                print(json.dumps(line), flush=True)
    print(f"\nsteady images/s, median of {args.rounds} round(s) (current / classic):")
    print(f"  {'model':<11} {'ranks':>5} {'classic':>9} {'current':>9} {'ratio':>6}")
    for model in args.models.split(","):
        for ranks in (1, 2):
            classic = statistics.median(seen["classic", model, ranks])
            current = statistics.median(seen["current", model, ranks])
            print(
                f"  {model:<11} {ranks:>5} {classic:9.1f} {current:9.1f} {current / classic:6.2f}"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
