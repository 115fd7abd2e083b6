"""The readers side by side in one run: what each costs per image, and whether one core of it
keeps an emulated accelerator busy (MLPerf Storage's AU, ``hvdflow.bench.feed``).

    .venv/bin/python -m studies.reader_throughput [--rounds 2] [--photos 2400] [--no-store]
                                                  [--preset vgg16-h200-bf16]

Digits at 28x28x1 and Caltech101-like photos at 224x224x3 (PNG, JPEG, raw pixels), on local disk
and in an embedded SeaweedFS bucket. Ways of reading, where installed: ours into tf.data
(float32, as a Keras rank trains) and as numpy batches read ahead (uint8, as a PyTorch loop
would take them), Petastorm's reader into tf.data, a plain PyTorch ``DataLoader`` over the same
Parquet files (the baseline a user would write: pyarrow, PIL, one worker) and ``load_shard``
(the shard's bytes decoded at once: the cost of the bytes). "Pull": read as fast as it goes, best
of the rounds, images per CPU-second of the process and its workers. "AU": the process pinned to
one core, 3 epochs against the emulated accelerator.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import resource
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np

from hvdflow.bench import feed
from hvdflow.infra import extras
from hvdflow.training import parquet_reader
from hvdflow.training.reader import load_shard, open_dataset
from studies.preprocess_throughput import make_caltech_like

PETASTORM = extras.installed(extras.PETASTORM)
TORCH = extras.installed(extras.TORCH)


def ways(raw: bool) -> list[str]:
    found = ["tf.data", "numpy"]
    found += ["petastorm"] if PETASTORM and not raw else []
    return found + (["dataloader"] if TORCH else []) + ["load_shard"]


def cpu_seconds() -> float:
    """This process's CPU time and that of its children waited for (DataLoader's workers)."""
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return time.process_time() + children.ru_utime + children.ru_stime


def dataloader(url: str, batch: int, persistent: bool = False):
    """The loader a user writes: row groups read with pyarrow, each image decoded by PIL (or
    viewed, for raw pixels), DataLoader's collate, one worker."""
    import pyarrow.parquet as pq  # noqa: PLC0415
    import torch  # noqa: PLC0415
    from PIL import Image  # noqa: PLC0415

    files = parquet_reader.SplitFiles(url)
    description = parquet_reader.read_description(url, files)
    image = description.field("image")

    class ParquetImages(torch.utils.data.IterableDataset):
        def __iter__(self):
            for name in description.row_groups:
                parquet = pq.ParquetFile(files.fs.open_input_file(f"{files.root}/{name}"))
                for group in range(parquet.num_row_groups):
                    table = parquet.read_row_group(group, columns=["image", "label"])
                    for value, label in zip(
                        *(table.column(c).to_pylist() for c in ("image", "label")), strict=True
                    ):
                        if image.codec == "raw":
                            pixels = np.frombuffer(value, np.uint8).reshape(image.shape).copy()
                        else:
                            pixels = np.array(Image.open(io.BytesIO(value)))
                        yield pixels, label

    return torch.utils.data.DataLoader(
        ParquetImages(), batch_size=batch, num_workers=1, persistent_workers=persistent
    )


def pull(url: str, way: str, batch: int) -> int:
    """One pass over the split the way named; the images read."""
    if way == "load_shard":
        return len(load_shard(url, reader="pyarrow")[0])
    if way == "dataloader":
        return sum(len(labels) for _, labels in dataloader(url, batch))
    if way == "numpy":
        batches = parquet_reader.iter_batches(url, batch_size=batch, num_epochs=1)
        return sum(len(labels) for _, labels in feed.read_ahead(batches))
    reader = "petastorm" if way == "petastorm" else "pyarrow"
    with open_dataset(url, batch_size=batch, num_epochs=1, reader=reader) as dataset:
        return sum(int(labels.shape[0]) for _, labels in dataset)


def forever(loader):
    while True:
        yield from loader


def au_on_one_core(url: str, way: str, device: feed.Accelerator, rows: int) -> float:
    """MLPerf Storage's AU over 3 epochs, this process (and any worker) on one core."""
    if way == "dataloader":
        stream = forever(dataloader(url, device.batch, persistent=True))
    else:
        named = {"petastorm": ("tf.data", "petastorm")}.get(way, (way, "pyarrow"))
        stream = feed.batches(url, named[0], device.batch, 0, 1, named[1])
    before = os.sched_getaffinity(0)
    feed.pin_threads({min(before)})
    try:
        feeds = feed.emulate(stream, device, epochs=3, steps=max(1, rows // device.batch))
    finally:
        stream.close()
        feed.pin_threads(before)
    return feed.totals(feeds).au


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


def make_datasets(stack, workdir: Path, photos: int, store: bool) -> dict:
    from hvdflow.infra.spark import get_spark  # noqa: PLC0415 (lazy: it loads Spark)
    from hvdflow.tasks.preprocess import PreprocessConfig, preprocess_images  # noqa: PLC0415

    make_caltech_like(workdir / "photos", photos, classes=10)
    spark = get_spark("local[2]", "hvdflow-bench", {"spark.ui.showConsoleProgress": "false"})
    spark.sparkContext.setLogLevel("ERROR")
    outputs = {"disk": str(workdir)} | (
        {"store": start_store(stack, workdir / "s")} if store else {}
    )
    kinds = {  # name: input, its format, size, colour, encoding
        "28x28x1 png": ("digits", "digits", (28, 28), "L", "png"),
        "224x224x3 png": ("photos", "folders", (224, 224), "RGB", "png"),
        "224x224x3 jpeg": ("photos", "folders", (224, 224), "RGB", "jpeg"),
        "224x224x3 raw": ("photos", "folders", (224, 224), "RGB", "raw"),
    }
    datasets = {}
    for where, out in outputs.items():
        for name, (folder, form, size, colour, encoding) in kinds.items():
            config = PreprocessConfig(
                input=str(workdir / folder), input_format=form, output=f"{out}/{encoding}{size[0]}",
                image_size=size, color_mode=colour, image_encoding=encoding,
            )  # fmt: skip
            datasets[f"{name} {where}"] = preprocess_images(spark, config)
    spark.stop()
    return datasets


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--photos", type=int, default=2400, help="224x224x3 images to make")
    parser.add_argument("--preset", default="vgg16-h200-bf16", choices=list(feed.PRESETS))
    parser.add_argument("--no-store", dest="store", action="store_false", help="local disk only")
    args = parser.parse_args(argv)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    device = feed.accelerator(args.preset)
    workdir = Path(tempfile.mkdtemp(prefix="hvdflow-bench-reader-"))
    with contextlib.ExitStack() as stack:
        stack.callback(shutil.rmtree, workdir, ignore_errors=True)
        datasets = make_datasets(stack, workdir, args.photos, args.store)
        best: dict[tuple[str, str], float] = {}
        aus: dict[tuple[str, str], list[float]] = {}
        for name, manifest in datasets.items():  # warm-up: imports, TensorFlow, tracing
            for way in ways("raw" in name):
                pull(manifest.train_url, way, device.batch)
        for round_ in range(args.rounds):
            for name, manifest in datasets.items():
                order = ways("raw" in name)
                for way in order if round_ % 2 == 0 else order[::-1]:
                    cpu = cpu_seconds()
                    images = pull(manifest.train_url, way, device.batch)
                    rate = images / max(cpu_seconds() - cpu, 1e-9)
                    best[(name, way)] = max(best.get((name, way), 0.0), rate)
                    au = 0.0
                    if way != "load_shard":
                        au = au_on_one_core(manifest.train_url, way, device, manifest.train_rows)
                        aus.setdefault((name, way), []).append(au)
                    print(
                        f"  round {round_ + 1} {name:>20} {way:>10}: {rate:9,.0f}/CPU-s, "
                        f"AU {au:.1%}"
                    )
        print(
            f"\nimages per CPU-second (pull, best of {args.rounds}) and AU on one core (mean) "
            f"({device.name}, {device.step_s * 1e3:.1f} ms per {device.batch}; "
            f"load {os.getloadavg()[0]:.2f}):"
        )
        every = ways(raw=False)
        print(
            "| dataset | "
            + " | ".join(every)
            + " | "
            + " | ".join(f"AU {w}" for w in every[:-1])
            + " |"
        )
        print("|---" * (2 * len(every)) + "|")
        for name, manifest in datasets.items():
            here = ways("raw" in name)
            pulls = [f"{best[(name, w)]:,.0f}" if w in here else "-" for w in every]
            mean = [f"{np.mean(aus[(name, w)]):.1%}" if w in here else "-" for w in every[:-1]]
            print(f"| {name} ({manifest.train_rows}) | " + " | ".join(pulls + mean) + " |")
        pairs = [
            ("tf.data", "petastorm"),
            ("numpy", "dataloader"),
            ("tf.data", "load_shard"),
            ("numpy", "load_shard"),
        ]
        for name in datasets:
            here = ways("raw" in name)
            said = [
                f"{a} / {b} {best[(name, a)] / best[(name, b)]:.2f}x" for a, b in pairs if b in here
            ]
            print(f"  {name}, per CPU-second: " + ", ".join(said))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
