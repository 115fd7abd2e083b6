"""The pipeline's PyTorch trainer at np=1 and np=2 against one torch process on every core and
against the machine's ceiling, side by side in one run.

    .venv/bin/python -m studies.torch_engine --images 20000 --epochs 3 --repetitions 2 \
        --target 0.95 [--out FILE]

The study's MNIST-shaped stand-in (``bench.workloads``), the paper's MNIST CNN in torch (Adam
0.001, global batch 128). ``torch1``/``torch2``: one and two ranks of one thread (DDP over gloo);
``alone``: one process, a thread per core; ``ceiling``: two processes each training half alone.
Prints steady images/s, val_accuracy per epoch and the seconds to ``--target``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import tempfile
from pathlib import Path

from hvdflow.bench.workloads import total_for_training, write_augmented_digits_idx
from hvdflow.infra import HorovodRunner, LaunchOptions, get_spark
from hvdflow.tasks.config import TrainingParams
from hvdflow.tasks.preprocess import PreprocessConfig, preprocess_images
from hvdflow.tasks.train.spec import training_spec
from hvdflow.training.torch_trainer import train_classifier_torch

CONDITIONS = ("torch1", "torch2", "alone", "ceiling")
VAL_FRACTION = 0.05


def dataset(images: int, root: Path):
    """The MNIST-shaped workload of ``images`` training images, preprocessed."""
    raw = root / "idx"
    write_augmented_digits_idx(str(raw), total_for_training(images, VAL_FRACTION))
    spark = get_spark("local[2]", "hvdflow-bench-torch-engine", {"spark.ui.enabled": "false"})
    return preprocess_images(
        spark,
        PreprocessConfig(
            input=str(raw),
            input_format="mnist_idx",
            output=str(root / "datasets"),
            image_size=(28, 28),
            val_fraction=VAL_FRACTION,
        ),
    )


def run_condition(name: str, spec) -> dict:
    cores = len(os.sched_getaffinity(0))
    if name == "torch1":
        np, spec = -1, spec.replace(threads=1)
    elif name == "torch2":
        np, spec = -2, spec.replace(threads=1)
    elif name == "alone":
        np, spec = -1, spec.replace(threads=cores, use_horovod=False)
    else:  # ceiling: each process a half share of the steps, alone
        half = dataclasses.replace(spec.data, train_rows=spec.data.train_rows // 2)
        np, spec = -2, spec.replace(threads=1, use_horovod=False, data=half)
    result = HorovodRunner(np=np, options=LaunchOptions(engine="torch")).run(
        train_classifier_torch, spec=spec
    )
    processes = 2 if name == "ceiling" else 1
    steady = statistics.median(result.epoch_times[1:]) if len(result.epoch_times) > 1 else None
    return {
        "condition": name,
        "images_per_s": processes * result.images_per_epoch / steady if steady else None,
        "epoch_times": list(result.epoch_times),
        "val_accuracy": list(result.history.get("val_accuracy", [])),
    }


def seconds_to(row: dict, target: float) -> float | None:
    """Training seconds until the first epoch whose validation accuracy reached ``target``."""
    elapsed = 0.0
    for took, accuracy in zip(row["epoch_times"], row["val_accuracy"], strict=False):
        elapsed += took
        if accuracy >= target:
            return elapsed
    return None


def markdown(rows: list[dict], target: float) -> str:
    def med(values):
        values = [v for v in values if v is not None]
        return statistics.median(values) if values else None

    by = {name: [r for r in rows if r["condition"] == name] for name in CONDITIONS}
    rate = {name: med(r["images_per_s"] for r in by[name]) for name in CONDITIONS}
    lines = [
        f"| condition | steady images/s (median) | vs torch1 | share of the ceiling | final "
        f"val_accuracy (each rep) | s to {target} (each rep) |",
        "|---|---|---|---|---|---|",
    ]
    for name in CONDITIONS:
        finals = ", ".join(f"{r['val_accuracy'][-1]:.4f}" for r in by[name] if r["val_accuracy"])
        times = ", ".join(
            f"{t:.1f}" if (t := seconds_to(r, target)) is not None else "not reached"
            for r in by[name]
        )
        ours = rate[name]
        lines.append(
            f"| {name} | {ours:.0f} | {ours / rate['torch1']:.2f}x | "
            f"{ours / rate['ceiling']:.0%} | {finals} | {times} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=30_000)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--repetitions", type=int, default=2)
    parser.add_argument("--target", type=float, default=0.95)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="hvdflow-bench-torch-") as scratch:
        data = dataset(args.images, Path(scratch))
        params = TrainingParams(model="mnist_cnn", framework="torch", epochs=args.epochs)
        spec = training_spec(params, data).replace(chance_margin=None)
        rows = []
        for repetition in range(args.repetitions):
            order = CONDITIONS if repetition % 2 == 0 else tuple(reversed(CONDITIONS))
            for name in order:
                rows.append({**run_condition(name, spec), "repetition": repetition})
                print(json.dumps(rows[-1]), flush=True)  # noqa: T201 (a benchmark's output)
    table = markdown(rows, args.target)
    print(table)  # noqa: T201
    if args.out:
        args.out.write_text(json.dumps({"rows": rows, "table": table}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
