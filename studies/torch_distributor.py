"""hvdflow's TorchDistributor against pyspark's, side by side on the same training function.

    .venv/bin/python -m studies.torch_distributor --rounds 5 --epochs 4 [--out FILE]

Both at ``num_processes=2, local_mode=False, use_gpu=False`` on one session, alternating (a
small CNN, DDP over gloo); then each with rank 1 SIGKILLed as epoch 2 begins. Prints a table.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import threading
import time
from pathlib import Path

from hvdflow.infra import LaunchOptions, TorchDistributor, get_spark

SAMPLES = 4096
BATCH = 64


def train(epochs: int = 4, die_in_epoch: int | None = None, marks: str | None = None) -> dict:
    """DDP training as a pyspark TorchDistributor user writes it (init from the environment)."""
    # In the function, as its users write it: it runs in the training processes only.
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel
    from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    generator = torch.Generator().manual_seed(0)
    images = torch.randn(SAMPLES, 1, 28, 28, generator=generator)
    labels = (images[:, 0, :14].mean((1, 2)) > images[:, 0, 14:].mean((1, 2))).long()
    data = TensorDataset(images, labels)
    sampler = DistributedSampler(data, num_replicas=world, rank=rank, seed=0)
    loader = DataLoader(data, batch_size=BATCH // world, sampler=sampler)
    torch.manual_seed(0)
    model = DistributedDataParallel(
        torch.nn.Sequential(
            torch.nn.Conv2d(1, 32, 3),
            torch.nn.ReLU(),
            torch.nn.MaxPool2d(2),
            torch.nn.Conv2d(32, 64, 3),
            torch.nn.ReLU(),
            torch.nn.MaxPool2d(2),
            torch.nn.Flatten(),
            torch.nn.Linear(64 * 5 * 5, 2),
        )
    )
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    first_step_at = None
    epoch_s = []
    for epoch in range(epochs):
        if epoch == die_in_epoch and rank == 1:
            Path(marks, "killed_at").write_text(repr(time.time()))
            os.kill(os.getpid(), 9)
        sampler.set_epoch(epoch)
        started = time.perf_counter()
        for x, y in loader:
            optimizer.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
            optimizer.step()
            if first_step_at is None:
                first_step_at = time.time()
        epoch_s.append(time.perf_counter() - started)
    with torch.no_grad():
        accuracy = (model(images).argmax(1) == labels).float().mean().item()
    dist.destroy_process_group()
    return {
        "first_step_at": first_step_at,
        "epoch_s": epoch_s,
        "accuracy": accuracy,
        "threads": torch.get_num_threads(),
        "interop_threads": torch.get_num_interop_threads(),
        "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
        "affinity": sorted(os.sched_getaffinity(0)),
    }


def _distributor(kind: str, spark):
    if kind == "hvdflow":
        return TorchDistributor(
            num_processes=2, local_mode=False, use_gpu=False, options=LaunchOptions(spark=spark)
        )
    from pyspark.ml.torch.distributor import TorchDistributor as Original  # noqa: PLC0415

    return Original(num_processes=2, local_mode=False, use_gpu=False)


def measure(kind: str, spark, epochs: int) -> dict:
    distributor = _distributor(kind, spark)
    started = time.time()
    result = distributor.run(train, epochs=epochs)
    return {
        "kind": kind,
        "launch_to_first_step_s": result["first_step_at"] - started,
        "steady_epoch_s": statistics.median(result["epoch_s"][1:]),
        "total_s": time.time() - started,
        "accuracy": result["accuracy"],
        "threads": result["threads"],
        "interop_threads": result["interop_threads"],
        "omp_num_threads": result["omp_num_threads"],
        "affinity": result["affinity"],
    }


def measure_kill(kind: str, spark, timeout_s: float) -> dict:
    """Rank 1 SIGKILLed as epoch 2 begins: seconds from the kill to the driver's error."""
    marks = tempfile.mkdtemp(prefix="hvdflow-kill-")
    distributor = _distributor(kind, spark)
    cancelled = threading.Event()

    def cancel() -> None:
        cancelled.set()
        spark.sparkContext.cancelAllJobs()

    timer = threading.Timer(timeout_s, cancel)
    timer.start()
    try:
        distributor.run(train, epochs=50, die_in_epoch=1, marks=marks)
        error = None
    except Exception as e:  # noqa: BLE001 (what each raises is the measurement)
        error = e
    finally:
        timer.cancel()
    ended = time.time()
    killed_at = float(Path(marks, "killed_at").read_text())
    text = str(error) if error is not None else "(no error)"
    return {
        "kind": kind,
        "kill_to_error_s": ended - killed_at,
        "cancelled_after_timeout": cancelled.is_set(),
        "error": type(error).__name__ if error is not None else None,
        "first_line": text.strip().splitlines()[0][:160] if text.strip() else "",
        "names_rank_1": "rank 1" in text,
        "has_signal": "SIGKILL" in text or "Signals.SIGKILL" in text or "signal 9" in text,
    }


def markdown(runs: list[dict], kills: list[dict]) -> str:
    def med(kind: str, key: str) -> float:
        return statistics.median(r[key] for r in runs if r["kind"] == kind)

    lines = [
        "| | hvdflow | pyspark | hvdflow / pyspark |",
        "|---|---|---|---|",
    ]
    for key, label in (
        ("launch_to_first_step_s", "launch to the first step, s (median)"),
        ("steady_epoch_s", "steady epoch, s (median of epochs 2+)"),
        ("total_s", "whole run, s (median)"),
        ("accuracy", "training-set accuracy (median)"),
    ):
        ours, theirs = med("hvdflow", key), med("pyspark", key)
        lines.append(f"| {label} | {ours:.3f} | {theirs:.3f} | {ours / theirs:.2f}x |")
    threads = {r["kind"]: r["threads"] for r in runs}
    lines.append(f"| torch threads per process | {threads['hvdflow']} | {threads['pyspark']} | |")
    by_kind = {k["kind"]: k for k in kills}
    ours, theirs = by_kind["hvdflow"], by_kind["pyspark"]
    lines.append(
        f"| rank 1 SIGKILLed: kill to the driver's error, s | {ours['kill_to_error_s']:.1f} | "
        f"{theirs['kill_to_error_s']:.1f}"
        f"{' (cancelled at the timeout)' if theirs['cancelled_after_timeout'] else ''} | |"
    )
    for kind, kill in (("hvdflow", ours), ("pyspark", theirs)):
        lines.append(
            f"| {kind}'s error: `{kill['error']}`, names rank 1: {kill['names_rank_1']}, "
            f"names the signal: {kill['has_signal']} | `{kill['first_line']}` | | |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--kill-timeout", type=float, default=180.0)
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--out", type=Path, default=None, help="also write the figures as JSON")
    args = parser.parse_args(argv)
    spark = get_spark(args.master, "hvdflow-bench-torch", {"spark.ui.enabled": "false"})
    runs = []
    for round_index in range(args.rounds):
        order = ("hvdflow", "pyspark") if round_index % 2 == 0 else ("pyspark", "hvdflow")
        for kind in order:
            runs.append(measure(kind, spark, args.epochs))
            print(json.dumps(runs[-1]), flush=True)  # noqa: T201 (a benchmark's output)
    kills = []
    for kind in ("hvdflow", "pyspark"):
        kills.append(measure_kill(kind, spark, args.kill_timeout))
        print(json.dumps(kills[-1]), flush=True)  # noqa: T201
    table = markdown(runs, kills)
    print(table)  # noqa: T201
    if args.out:
        args.out.write_text(json.dumps({"runs": runs, "kills": kills, "table": table}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
