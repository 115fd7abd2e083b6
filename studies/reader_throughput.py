"""Petastorm's reader against the pyarrow reader, side by side in one run.

    .venv/bin/python -m studies.reader_throughput [--rounds 3] [--photos 600] [--no-store]

Digits at 28x28x1 and Caltech101-like photos at 224x224x3 (also as raw pixels), each on local
disk and in an embedded SeaweedFS bucket; streamed (``open_dataset``) and loaded whole
(``load_shard``), readers alternating. Shows images/s and images per CPU-second of the process,
best of the rounds. Where Petastorm is not installed (the current profile), pyarrow runs alone.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import tempfile
import time
from functools import partial
from pathlib import Path

from hvdflow.infra import extras
from hvdflow.training.reader import load_shard, open_dataset
from studies.preprocess_throughput import make_caltech_like

READERS = ("petastorm", "pyarrow") if extras.installed(extras.PETASTORM) else ("pyarrow",)


def timed(read) -> tuple[int, float, float]:
    """(images, wall seconds, CPU seconds of this process) of ``read()``, which returns the
    images it read."""
    wall, cpu = time.perf_counter(), time.process_time()
    images = read()
    return images, time.perf_counter() - wall, time.process_time() - cpu


def stream(url: str, reader: str, batch_size: int) -> int:
    with open_dataset(url, batch_size=batch_size, num_epochs=1, reader=reader) as dataset:
        return sum(int(labels.shape[0]) for _, labels in dataset)


def load(url: str, reader: str) -> int:
    return len(load_shard(url, reader=reader)[0])


def readers_for(name: str) -> tuple[str, ...]:
    """Petastorm's reader cannot read raw pixels (``data.image_encoding``): pyarrow's alone."""
    return ("pyarrow",) if name.endswith(" raw") else READERS


def preprocess(
    spark, root: Path, out: Path, image_size, color_mode, input_format: str, encoding="png"
):
    from hvdflow.tasks.preprocess import PreprocessConfig, preprocess_images  # noqa: PLC0415 (lazy: it loads Spark)

    config = PreprocessConfig(
        input=str(root),
        input_format=input_format,
        output=str(out),
        image_size=image_size,
        color_mode=color_mode,
        image_encoding=encoding,
    )
    return preprocess_images(spark, config)


def start_store(stack: contextlib.ExitStack, data_dir: Path) -> str:
    """A SeaweedFS server on loopback for the rest of the run, its AWS variables set: the
    ``s3://`` prefix to write the datasets under."""
    from hvdflow.infra._env import temporary_env  # noqa: PLC0415
    from hvdflow.infra.services.seaweed import SeaweedServer  # noqa: PLC0415
    from hvdflow.infra.storage.object_store import ObjectStore, ObjectStoreConfig  # noqa: PLC0415

    server = SeaweedServer(data_dir).start()
    stack.callback(server.stop)
    stack.enter_context(temporary_env(server.env()))
    config = ObjectStoreConfig(bucket="bench", prefix="readers", endpoint_url=server.endpoint_url)
    ObjectStore(config).ensure_bucket()
    return "s3://bench/readers"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--photos", type=int, default=600, help="224x224x3 images to make")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--no-store", dest="store", action="store_false", help="local disk only")
    args = parser.parse_args(argv)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")

    from hvdflow.infra.spark import get_spark  # noqa: PLC0415 (lazy: it loads Spark)

    workdir = Path(tempfile.mkdtemp(prefix="hvdflow-bench-reader-"))
    with contextlib.ExitStack() as stack:
        stack.callback(shutil.rmtree, workdir, ignore_errors=True)
        make_caltech_like(workdir / "photos", args.photos, classes=10)
        spark = get_spark("local[2]", "hvdflow-bench", {"spark.ui.showConsoleProgress": "false"})
        spark.sparkContext.setLogLevel("ERROR")
        outputs = {"disk": str(workdir)}
        if args.store:
            outputs["store"] = start_store(stack, workdir / "seaweed")
        datasets = {}
        for where, out in outputs.items():
            datasets[f"28x28x1 {where}"] = preprocess(
                spark, workdir / "digits", f"{out}/d-out", (28, 28), "L", "digits"
            )
            datasets[f"224x224x3 {where}"] = preprocess(
                spark, workdir / "photos", f"{out}/p-out", (224, 224), "RGB", "folders"
            )
            datasets[f"224x224x3 {where} raw"] = preprocess(
                spark, workdir / "photos", f"{out}/r-out", (224, 224), "RGB", "folders", "raw"
            )
        spark.stop()
        ways = {
            "stream": lambda url, reader: stream(url, reader, args.batch_size),
            "load_shard": load,
        }
        for name, manifest in datasets.items():  # warm-up: imports, TensorFlow, tracing
            for reader in readers_for(name):
                for way in ways.values():
                    way(manifest.train_url, reader)

        best: dict[tuple[str, str, str], tuple[float, float]] = {}
        for round_ in range(args.rounds):
            order = READERS if round_ % 2 == 0 else READERS[::-1]
            for name, manifest in datasets.items():
                for way_name, way in ways.items():
                    for reader in (r for r in order if r in readers_for(name)):
                        images, wall, cpu = timed(partial(way, manifest.train_url, reader))
                        key = (name, way_name, reader)
                        rate, per_cpu = images / wall, images / max(cpu, 1e-9)
                        old = best.get(key, (0.0, 0.0))
                        best[key] = (max(old[0], rate), max(old[1], per_cpu))
                        print(
                            f"  round {round_ + 1} {name:>19} {way_name:>10} {reader:>9}: "
                            f"{images} images, {rate:8.1f}/s, {per_cpu:8.1f}/CPU-s",
                            flush=True,
                        )

        load_avg = ", ".join(f"{v:.2f}" for v in os.getloadavg())
        print(f"\nreaders, best of {args.rounds} rounds (one rank of one; load {load_avg}):")
        header = f"  {'dataset':<20} {'read':<11}"
        for reader in READERS:
            header += f" {reader + ' img/s':>16} {reader + ' /CPU-s':>17}"
        print(header + (f" {'ratio /CPU-s':>13}" if len(READERS) > 1 else ""))
        for name, manifest in datasets.items():
            for way_name in ways:
                line = f"  {name:<20} {way_name:<11}"
                for reader in READERS:
                    if reader not in readers_for(name):
                        line += f" {'-':>16} {'-':>17}"
                        continue
                    rate, per_cpu = best[(name, way_name, reader)]
                    line += f" {rate:16.1f} {per_cpu:17.1f}"
                if readers_for(name) == READERS and len(READERS) > 1:
                    ours, theirs = (best[(name, way_name, r)][1] for r in ("pyarrow", "petastorm"))
                    line += f" {ours / theirs:13.2f}"
                print(line)
            print(f"  ({name}: {manifest.train_rows} training images)")
        if len(READERS) > 1:
            print("  ratio: pyarrow's images per CPU-second over Petastorm's")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
