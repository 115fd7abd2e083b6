"""Preprocessing and reading throughput, measured side by side in one run.

    .venv/bin/python -m studies.preprocess_throughput

1. The Spark preprocessing job on a warm local[2] session against a single-process Pillow loop
   doing the same per-image work, on 2,000 Caltech101-like JPEGs (to 224x224 RGB) and 10,000
   small JPEGs (to 28x28 grayscale); interleaved, best of ``--rounds``.
2. The Petastorm reader's images/s on the small train split against what the MNIST CNN
   consumes in one process (``--no-reader`` skips it).
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from hvdflow.training.models import build_model
from hvdflow.training.reader import open_dataset


@dataclass(frozen=True)
class Workload:
    name: str
    images: int
    image_size: tuple[int, int]
    color_mode: str
    described: str


def make_small_images(root: Path, count: int) -> None:
    """The digits, upscaled to 64x64 RGB JPEGs with noise, one folder per digit."""
    from PIL import Image
    from sklearn.datasets import load_digits

    digits = load_digits()
    rng = np.random.default_rng(0)
    for i in range(count):
        image, label = digits.images[i % len(digits.images)], digits.target[i % len(digits.target)]
        gray = (image * 15.9).astype(np.uint8)
        big = np.asarray(Image.fromarray(gray).resize((64, 64), Image.BILINEAR), dtype=np.int16)
        noisy = np.clip(big[..., None] + rng.integers(-20, 20, (64, 64, 3)), 0, 255)
        folder = root / str(label)
        folder.mkdir(parents=True, exist_ok=True)
        Image.fromarray(noisy.astype(np.uint8), "RGB").save(folder / f"{i:05d}.jpg", quality=90)


def make_caltech_like(root: Path, count: int, classes: int = 101) -> None:
    """Photo-like JPEGs of about 300x200: smooth random colour fields, a few shapes, grain."""
    from PIL import Image, ImageDraw

    rng = np.random.default_rng(1)
    for i in range(count):
        width, height = int(rng.integers(260, 341)), int(rng.integers(180, 221))
        coarse = rng.integers(0, 256, (6, 9, 3), dtype=np.uint8)
        image = Image.fromarray(coarse, "RGB").resize((width, height), Image.BICUBIC)
        draw = ImageDraw.Draw(image)
        for _ in range(4):
            x, y = int(rng.integers(0, width)), int(rng.integers(0, height))
            r = int(rng.integers(10, 60))
            colour = tuple(int(v) for v in rng.integers(0, 256, 3))
            draw.ellipse((x - r, y - r, x + r, y + r), fill=colour)
        pixels = np.asarray(image, dtype=np.int16) + rng.integers(-8, 8, (height, width, 3))
        folder = root / f"class_{i % classes:03d}"
        folder.mkdir(parents=True, exist_ok=True)
        photo = Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8), "RGB")
        photo.save(folder / f"image_{i:05d}.jpg", quality=85)


def pillow_loop(root: Path, image_size, color_mode) -> tuple[int, float]:
    """The executors' per-image work in one process: read, decode, fit, PNG-encode."""
    from hvdflow.tasks.images.decode import Good  # noqa: PLC0415 (lazy: it loads NumPy)
    from hvdflow.tasks.images.encode import encode_png  # noqa: PLC0415
    from hvdflow.tasks.images.fetch import decode_item  # noqa: PLC0415 (lazy: it loads NumPy)
    from hvdflow.tasks.images.listing import list_class_folders  # noqa: PLC0415 (lazy: a tenth of a second of imports)
    from hvdflow.tasks.preprocess.schema import image_shape  # noqa: PLC0415

    shape = image_shape(image_size, color_mode)
    started = time.perf_counter()
    good = 0
    for item in list_class_folders(str(root)).items:
        for record in decode_item(item, image_size, color_mode, 50_000_000):
            if isinstance(record, Good):
                encode_png(record.image, shape)
                good += 1
    return good, time.perf_counter() - started


def spark_job(spark, root: Path, out: Path, workload: Workload):
    from hvdflow.tasks.preprocess import PreprocessConfig, preprocess_images  # noqa: PLC0415 (lazy: it loads Spark)

    config = PreprocessConfig(
        input=str(root),
        input_format="folders",
        output=str(out),
        image_size=workload.image_size,
        color_mode=workload.color_mode,
    )
    started = time.perf_counter()
    manifest = preprocess_images(spark, config)
    return manifest, time.perf_counter() - started


def mnist_cnn_consumption(batch_size: int, images: int) -> float:
    import tensorflow as tf

    x = np.random.default_rng(0).random((images, 28, 28, 1), dtype=np.float32)
    y = np.random.default_rng(1).integers(0, 10, images)
    model = build_model("mnist_cnn", seed=0)
    model.compile(tf.keras.optimizers.Adadelta(1.0), "sparse_categorical_crossentropy")
    model.fit(x[: batch_size * 5], y[: batch_size * 5], batch_size=batch_size, verbose=0)  # warm up
    started = time.perf_counter()
    model.fit(x, y, batch_size=batch_size, epochs=1, verbose=0)
    return images / (time.perf_counter() - started)


def reader_rate(url: str, batch_size: int, images: int) -> float:
    with open_dataset(url, batch_size=batch_size) as dataset:
        iterator = iter(dataset)
        next(iterator)  # warm up: the first batch pays for opening files and tracing
        started, seen = time.perf_counter(), 0
        while seen < images:
            seen += int(next(iterator)[0].shape[0])
    return seen / (time.perf_counter() - started)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--caltech-images", type=int, default=2000)
    parser.add_argument("--small-images", type=int, default=10000)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--no-reader", action="store_true", help="skip the reader measurement")
    args = parser.parse_args(argv)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")

    from hvdflow.infra.spark import get_spark  # noqa: PLC0415 (lazy: it loads Spark)

    workloads = [
        Workload("caltech", args.caltech_images, (224, 224), "RGB", "~300x200 JPEG -> 224x224 RGB"),
        Workload("small", args.small_images, (28, 28), "L", "64x64 JPEG -> 28x28 L"),
    ]
    makers = {"caltech": make_caltech_like, "small": make_small_images}
    workdir = Path(tempfile.mkdtemp(prefix="hvdflow-bench-preprocess-"))
    try:
        for workload in workloads:
            print(f"writing {workload.images} images for {workload.name} ...", flush=True)
            makers[workload.name](workdir / workload.name, workload.images)
        spark = get_spark("local[2]", "hvdflow-bench", {"spark.ui.showConsoleProgress": "false"})
        spark.sparkContext.setLogLevel("ERROR")
        # Warm-up: start the JVM's Python workers and their imports, as a long-lived session has.
        make_small_images(workdir / "warmup", 400)
        spark_job(spark, workdir / "warmup", workdir / "warmup-out", workloads[1])

        results, manifests = {}, {}
        for workload in workloads:
            spark_rates, loop_rates = [], []
            for round_ in range(args.rounds):
                out = workdir / f"out-{workload.name}-{round_}"
                manifest, spark_s = spark_job(spark, workdir / workload.name, out, workload)
                rows = manifest.train_rows + manifest.val_rows
                spark_rates.append(rows / spark_s)
                loop_rows, loop_s = pillow_loop(
                    workdir / workload.name, workload.image_size, workload.color_mode
                )
                loop_rates.append(loop_rows / loop_s)
                manifests[workload.name] = manifest
                print(
                    f"  {workload.name} round {round_ + 1}: Spark {rows / spark_s:7.1f} images/s, "
                    f"loop {loop_rows / loop_s:7.1f} images/s",
                    flush=True,
                )
            results[workload.name] = (rows, max(spark_rates), max(loop_rates))

        load = ", ".join(f"{v:.2f}" for v in os.getloadavg())
        print(f"\npreprocessing, best of {args.rounds} rounds (images/s; load average {load}):")
        print(f"  {'workload':<44} {'Spark local[2]':>15} {'Pillow loop':>12} {'ratio':>6}")
        for workload in workloads:
            rows, spark_rate, loop_rate = results[workload.name]
            label = f"{workload.name}: {rows} {workload.described}"
            print(
                f"  {label:<44} {spark_rate:15.1f} {loop_rate:12.1f} {spark_rate / loop_rate:6.2f}"
            )
        print("  Spark: the whole preprocess_images call, Parquet writes and metadata included")
        print("  loop: the same per-image work in one process, nothing written")

        if not args.no_reader:
            manifest = manifests["small"]
            read = reader_rate(manifest.train_url, args.batch_size, manifest.train_rows * 2)
            consume = mnist_cnn_consumption(args.batch_size, min(8000, manifest.train_rows))
            print(f"\nreading the small train split (batch {args.batch_size}, one rank):")
            print(f"  Petastorm reader -> tf.data                {read:8.1f} images/s")
            print(f"  MNIST CNN training consumes                {consume:8.1f} images/s")
            print(f"  ratio reader / CNN                         {read / consume:8.2f}")
        spark.stop()
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
