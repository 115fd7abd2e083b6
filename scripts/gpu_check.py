"""hvdflow's own trainers on this machine's GPUs, without Spark: images/s per GPU and scaling.

    bash scripts/gpu-check.sh [--tiny] [--out FILE.json] [--frameworks torch,tensorflow]
                              [--models mnist_cnn,vgg16] [--ranks N] [--input]

Made for a GPU machine lent for minutes: no Spark, no Java, no network, no dataset, nothing
installed beyond what such a machine has (Python, PyTorch or TensorFlow, numpy, pyarrow);
``scripts/gpu-check.sh`` makes the checkout importable as ``hvdflow`` where it is not installed.

What runs is the pipeline's training function itself (``training.frameworks``: the PyTorch
trainer, DistributedDataParallel over NCCL on GPUs; the Keras trainer on the ``tf_collective``
engine) on synthetic images (``training.synthetic``), for each model at 1 rank and at N ranks
(N: the GPUs seen, one each; 2 on a machine without GPUs), ranks started as torchrun and the
launcher start them (``MASTER_ADDR``/``RANK``/``LOCAL_RANK``, or ``TF_CONFIG``). 1 rank is the
trainer alone, no engine: the baseline that N ranks must beat. Each rank keeps its own batch
(no global batch), as the paper's Horovod runs did, so scaling efficiency is images/s at N over
N times images/s at 1. Images/s is steady: the epochs after the first.

``--input`` also feeds VGG16 from a Parquet split of raw 224x224x3 pixels (written here with
pyarrow) through hvdflow's stream (``hvdflow.bench.feed``, numpy batches read ahead, as a PyTorch
rank would take them), and prints the accelerator utilisation twice, MLPerf Storage's way: real
(the device's own steps, the copy to it included) and emulated (sleeping for the step time the
device took with the batch already on it), so a lent GPU records both side by side.

Models: the paper's MNIST CNN at 28x28x1 and VGG16 at 224x224x3 (101 classes, Caltech101's);
``--tiny`` shrinks them to seconds on a CPU (CI's smoke test). A framework that is not installed
gets a row saying so, not a failure. Prints one markdown table and, with ``--out``, the figures
and the machine seen as JSON.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version

from hvdflow.bench import feed
from hvdflow.infra.constants import TF_COLLECTIVE
from hvdflow.training.frameworks import framework as framework_row
from hvdflow.training.spec import DataSpec, OptimizerSpec, TrainSpec
from hvdflow.training.synthetic import synthetic_url

# The paper's Table 2 (Pan, Liu and Zhou, AAAI DLGMA 2020; p2.8xlarge's K80 GPUs, Caltech101):
# scaling efficiencies from 2 to 8 GPUs, the range its rows span.
PAPER_SCALING = {"vgg16": "18.5-49.0%", "inceptionv3": "48.9-79.7%"}
IMPORTS = {"torch": "torch", "tensorflow": "tensorflow"}


@dataclass(frozen=True)
class Workload:
    """One model's synthetic data: images of ``shape``, ``rows_per_rank`` a rank trains on
    each epoch, ``batch`` a step per rank, and its recipe's optimizer."""

    model: str
    shape: tuple[int, int, int]
    classes: int
    rows_per_rank: int
    batch: int
    epochs: int
    optimizer: str
    learning_rate: float


FULL = {
    "mnist_cnn": Workload("mnist_cnn", (28, 28, 1), 10, 30_000, 128, 3, "adam", 0.001),
    "vgg16": Workload("vgg16", (224, 224, 3), 101, 2_048, 32, 3, "sgd", 0.01),
    # Not in the default models: `--models digits_mlp` asks for it.
    "digits_mlp": Workload("digits_mlp", (8, 8, 1), 10, 30_000, 32, 3, "adam", 0.01),
}
TINY = {
    "mnist_cnn": Workload("mnist_cnn", (28, 28, 1), 10, 256, 32, 2, "adam", 0.001),
    "vgg16": Workload("vgg16", (32, 32, 3), 101, 32, 8, 2, "sgd", 0.01),
    "digits_mlp": Workload("digits_mlp", (8, 8, 1), 10, 256, 32, 2, "adam", 0.01),
}


def gpus_seen() -> int:
    """GPUs that ``nvidia-smi -L`` lists (honouring CUDA_VISIBLE_DEVICES); 0 without it."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None and not visible.strip():
        return 0
    if shutil.which("nvidia-smi") is None:
        return 0
    listed = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, check=False)
    count = sum(line.startswith("GPU ") for line in listed.stdout.splitlines())
    if visible is not None:
        count = min(count, len([d for d in visible.split(",") if d.strip()]))
    return count


def _spec(framework: str, work: Workload, ranks: int):
    rows = work.rows_per_rank * ranks
    data = DataSpec(
        train_url=synthetic_url(rows, work.shape, work.classes),
        val_url=synthetic_url(0, work.shape, work.classes),  # no validation: images/s only
        train_rows=rows,
        val_rows=0,
        num_classes=work.classes,
        input_shape=work.shape,
    )
    return TrainSpec(
        data=data,
        model_name=work.model,
        framework=framework,
        epochs=work.epochs,
        batch_size=work.batch,
        optimizer=OptimizerSpec(work.optimizer, work.learning_rate, lr_scaling="none"),
        engine=TF_COLLECTIVE,
        use_horovod=ranks > 1,
        reader="pyarrow",
    )


def _free_ports(count: int) -> list[int]:
    sockets = [socket.socket() for _ in range(count)]
    try:
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def _rank_environments(framework: str, ranks: int, gpus: int) -> list[dict[str, str]]:
    """Each rank's environment, as torchrun (torch) or the launcher (tf_collective) gives it."""
    cores = len(os.sched_getaffinity(0))
    shared = {"OMP_NUM_THREADS": str(max(1, cores // ranks)), "HOROVOD_LOCAL_SIZE": str(ranks)}
    if ranks == 1:
        return [shared]
    if framework == "torch":
        port = _free_ports(1)[0]
        return [
            shared
            | {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "RANK": str(rank)}
            | {"WORLD_SIZE": str(ranks), "LOCAL_RANK": str(rank), "LOCAL_WORLD_SIZE": str(ranks)}
            for rank in range(ranks)
        ]
    workers = [f"127.0.0.1:{port}" for port in _free_ports(ranks)]
    environments = []
    for rank in range(ranks):
        config = {"cluster": {"worker": workers}, "task": {"type": "worker", "index": rank}}
        env = shared | {"TF_CONFIG": json.dumps(config)}
        if gpus:  # TensorFlow takes every GPU it sees: one each, as the launcher gives them
            env["CUDA_VISIBLE_DEVICES"] = str(rank % gpus)
        environments.append(env)
    return environments


def run_condition(framework: str, work: Workload, ranks: int, gpus: int) -> dict:
    """Train ``work`` with ``framework`` on ``ranks`` rank processes; rank 0's figures."""
    spec = _spec(framework, work, ranks)
    with tempfile.TemporaryDirectory(prefix="hvdflow-gpu-check-") as scratch:
        spec_path = os.path.join(scratch, "spec.json")
        with open(spec_path, "w") as f:
            json.dump(spec.to_dict(), f)
        result_path = os.path.join(scratch, "result.json")
        started = time.perf_counter()
        processes = []
        for rank, extra in enumerate(_rank_environments(framework, ranks, gpus)):
            log = open(os.path.join(scratch, f"rank-{rank}.log"), "w")  # noqa: SIM115 (closed below)
            command = [sys.executable, os.path.abspath(__file__), "--rank", spec_path]
            if rank == 0:
                command += ["--result", result_path]
            process = subprocess.Popen(
                command, env=os.environ | extra, stdout=log, stderr=subprocess.STDOUT
            )
            processes.append((process, log))
        failed = []
        for rank, (process, log) in enumerate(processes):
            if process.wait() != 0:
                failed.append(rank)
            log.close()
        if failed:
            tail = open(os.path.join(scratch, f"rank-{failed[0]}.log")).read()[-3000:]
            raise RuntimeError(
                f"{framework} {work.model} at {ranks} rank(s): rank(s) {failed} failed; "
                f"rank {failed[0]}'s output ends:\n{tail}"
            )
        with open(result_path) as f:
            result = json.load(f)
    epochs = result["epoch_times"]
    steady = epochs[1:] or epochs
    images_per_s = result["images_per_epoch"] / (sum(steady) / len(steady))
    return {
        "framework": framework,
        "model": work.model,
        "input": "x".join(map(str, work.shape)),
        "ranks": ranks,
        "device": "GPU" if gpus else "CPU",
        "batch_per_rank": work.batch,
        "epoch_times_s": [round(t, 3) for t in epochs],
        "images_per_s": images_per_s,
        "images_per_s_per_rank": images_per_s / ranks,
        "wall_s": time.perf_counter() - started,
    }


def _rank_main(spec_path: str, result_path: str | None) -> None:
    """One rank: the framework's own training function on the spec; rank 0 writes its result."""
    with open(spec_path) as f:
        spec = TrainSpec.from_dict(json.load(f))
    result = framework_row(spec.framework).training_function()(spec)
    if result_path:
        with open(result_path, "w") as f:
            json.dump(result.to_dict(), f)


def write_raw_split(folder: str, rows: int, shape: tuple[int, ...], classes: int) -> str:
    """A split of random raw-pixel images as preprocessing writes one (part file, description),
    made with pyarrow alone; its URL."""
    import numpy as np  # noqa: PLC0415
    import pyarrow as pa  # noqa: PLC0415
    import pyarrow.parquet as pq  # noqa: PLC0415

    from hvdflow.training import parquet_reader as pr  # noqa: PLC0415

    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, (rows, *shape), dtype=np.uint8)
    labels = pa.array(rng.integers(0, classes, rows), pa.int32())
    table = pa.table(
        {"image": pa.array([i.tobytes() for i in images], pa.binary()), "label": labels}
    )
    pq.write_table(table, os.path.join(folder, "part-00000.parquet"), row_group_size=64)
    fields = (
        pr.FieldDescription("image", "uint8", shape, "raw"),
        pr.FieldDescription("label", "int32", (), "scalar"),
    )
    description = pr.SplitDescription(fields, {"part-00000.parquet": -(-rows // 64)})
    with open(os.path.join(folder, pr.SCHEMA_FILE), "wb") as f:
        f.write(description.to_json())
    return folder


def input_check(work: Workload, gpus: int, rows: int) -> dict:
    """``work``'s model fed from a raw split: the device's step alone, then MLPerf Storage's AU
    of the real steps and of sleeping for that step, both fed by the same stream."""
    import torch  # noqa: PLC0415

    from hvdflow.training.torch_models import build_torch_model  # noqa: PLC0415

    on = torch.device("cuda" if gpus else "cpu")
    network = build_torch_model(work.model, work.shape, work.classes, seed=0).to(on)
    optimizer = torch.optim.SGD(network.parameters(), lr=work.learning_rate)

    def step(batch):
        images, labels = batch
        # uint8 over the bus and normalised on the device: a quarter of float32's bytes.
        x = torch.from_numpy(images).to(on, non_blocking=True).permute(0, 3, 1, 2).float() / 255
        y = torch.from_numpy(labels.astype("int64")).to(on, non_blocking=True)
        optimizer.zero_grad(set_to_none=True)
        torch.nn.functional.cross_entropy(network(x), y).backward()
        optimizer.step()
        if gpus:
            torch.cuda.synchronize()

    with tempfile.TemporaryDirectory(prefix="hvdflow-gpu-input-") as scratch:
        url = write_raw_split(scratch, rows, work.shape, work.classes)
        ready = next(feed.batches(url, "numpy", work.batch, 0, 1, None))
        on_device = tuple(torch.from_numpy(a) for a in ready)
        step(ready)  # warm-up: kernels chosen, memory allocated
        started = time.perf_counter()
        for _ in range(5):
            step(tuple(t.numpy() for t in on_device))
        device = feed.Accelerator(
            f"{work.model} here", (time.perf_counter() - started) / 5, work.batch, "measured"
        )
        run = {"epochs": work.epochs, "steps": max(1, rows // work.batch)}
        real = feed.totals(
            feed.emulate(
                feed.batches(url, "numpy", work.batch, 0, 1, None), device, step=step, **run
            )
        )
        emulated = feed.totals(
            feed.emulate(feed.batches(url, "numpy", work.batch, 0, 1, None), device, **run)
        )
    return {
        "model": work.model,
        "input": "x".join(map(str, work.shape)),
        "batch": work.batch,
        "device": "GPU" if gpus else "CPU",
        "step_ms": device.step_s * 1e3,
        "au_real": real.au,
        "au_emulated": emulated.au,
        "images_per_s_real": real.images_per_s,
        "reader_cpu_ms_per_image": emulated.cpu_s_per_image * 1e3,
    }


def machine() -> dict:
    seen = {
        "python": platform.python_version(),
        "cores": len(os.sched_getaffinity(0)),
        "gpus": gpus_seen(),
        "java_on_path": shutil.which("java") is not None,
    }
    for name, module in IMPORTS.items():
        spec = importlib.util.find_spec(module)
        seen[name] = None
        if spec is not None:
            try:
                seen[name] = version(name)
            except PackageNotFoundError:
                seen[name] = version("tensorflow-cpu") if name == "tensorflow" else "?"
    if seen["gpus"]:
        names = subprocess.run(
            ["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            check=False,
        )
        seen["gpu_names"] = sorted(set(names.stdout.split("\n")) - {""})
    return seen


def table(rows: list[dict], skipped: list[str]) -> str:
    lines = [
        "| framework | model | input | ranks | device | images/s | per rank | scaling | paper |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    alone = {(r["framework"], r["model"]): r["images_per_s"] for r in rows if r["ranks"] == 1}
    for r in rows:
        base = alone.get((r["framework"], r["model"]))
        scaling = (
            f"{r['images_per_s'] / (r['ranks'] * base):.1%}" if base and r["ranks"] > 1 else ""
        )
        paper = PAPER_SCALING.get(r["model"], "") if r["ranks"] > 1 else ""
        lines.append(
            f"| {r['framework']} | {r['model']} | {r['input']} | {r['ranks']} | {r['device']} | "
            f"{r['images_per_s']:.1f} | {r['images_per_s_per_rank']:.1f} | {scaling} | {paper} |"
        )
    lines += [f"\n{line}" for line in skipped]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tiny", action="store_true", help="seconds on a CPU (CI's smoke test)")
    parser.add_argument("--frameworks", default="torch,tensorflow")
    parser.add_argument("--models", default="mnist_cnn,vgg16")
    parser.add_argument("--ranks", type=int, help="N (default: the GPUs seen; 2 without GPUs)")
    parser.add_argument("--out", help="write the figures and the machine seen here (JSON)")
    parser.add_argument(
        "--input", action="store_true", help="also VGG16 fed from a raw split: real and emulated AU"
    )
    parser.add_argument("--rank", help=argparse.SUPPRESS)  # a rank process: its spec's path
    parser.add_argument("--result", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.rank:
        _rank_main(args.rank, args.result)
        return 0

    seen = machine()
    gpus = seen["gpus"]
    ranks = args.ranks or (gpus if gpus else 2)
    works = TINY if args.tiny else FULL
    print(f"[gpu-check] machine: {json.dumps(seen)}", flush=True)
    rows, skipped = [], []
    for framework in args.frameworks.split(","):
        if seen.get(framework) is None:
            skipped.append(
                f"{framework}: not installed here (`import {IMPORTS[framework]}` fails), "
                "so its trainer was not run"
            )
            continue
        for model in args.models.split(","):
            for n in sorted({1, ranks}):
                print(f"[gpu-check] {framework} {model} at {n} rank(s)...", flush=True)
                row = run_condition(framework, works[model], n, gpus)
                print(
                    f"[gpu-check]   {row['images_per_s']:.1f} images/s, epochs "
                    f"{row['epoch_times_s']} s, {row['wall_s']:.0f} s in all",
                    flush=True,
                )
                rows.append(row)
    if gpus == 1 and not args.ranks:
        skipped.append(f"scaling over GPUs needs 2 or more; this machine has {gpus}")
    print(table(rows, skipped))
    inputs = []
    if args.input and seen.get("torch") is not None:
        work = works["vgg16"]
        work = Workload(**{**work.__dict__, "batch": 8 if args.tiny else 128})
        inputs.append(input_check(work, gpus, 64 if args.tiny else 2_048))
        for r in inputs:
            print(
                f"\ninput: {r['model']} {r['input']} batch {r['batch']} on the {r['device']}, "
                f"{r['step_ms']:.1f} ms a step: AU {r['au_real']:.1%} real, "
                f"{r['au_emulated']:.1%} emulated; {r['images_per_s_real']:,.0f} images/s; "
                f"reader {r['reader_cpu_ms_per_image']:.3f} CPU-ms/image"
            )
    if args.out:
        figures = {"machine": seen, "tiny": args.tiny, "rows": rows, "notes": skipped}
        with open(args.out, "w") as f:
            json.dump(figures | {"input": inputs}, f)
    return 0 if rows else 1


if __name__ == "__main__":
    sys.exit(main())
