"""Preprocessing and reading throughput, measured side by side in one run.

1. The Spark preprocessing job on local[2] against a single-process Pillow loop doing the same
   per-image work (decode, convert, resize, PNG-encode as Petastorm stores it), on the same
   10,000 images (the bundled digits, upscaled to 64x64 RGB JPEGs with noise).
2. The Petastorm reader's images/s (batched tf.data, one rank) against what the MNIST CNN
   consumes per second when training in one process on in-memory arrays.

    .venv/bin/python -m bench.preprocess_throughput --images 10000
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path


def make_images(root: Path, count: int) -> list[Path]:
    import numpy as np
    from PIL import Image
    from sklearn.datasets import load_digits

    digits = load_digits()
    rng = np.random.default_rng(0)
    paths = []
    for i in range(count):
        image, label = digits.images[i % len(digits.images)], digits.target[i % len(digits.target)]
        gray = (image * 15.9).astype(np.uint8)
        big = np.asarray(Image.fromarray(gray).resize((64, 64), Image.BILINEAR), dtype=np.int16)
        noisy = np.clip(big[..., None] + rng.integers(-20, 20, (64, 64, 3)), 0, 255)
        folder = root / str(label)
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"{i:05d}.jpg"
        Image.fromarray(noisy.astype(np.uint8), "RGB").save(path, quality=90)
        paths.append(path)
    return paths


def pillow_loop(root: Path, image_size, color_mode) -> tuple[int, float]:
    import cv2

    from tasks.preprocess.decode import Good, decode_item
    from tasks.preprocess.sources import list_class_folders

    started = time.perf_counter()
    good = 0
    for item in list_class_folders(str(root)).items:
        for record in decode_item(item, image_size, color_mode, 50_000_000):
            if isinstance(record, Good):
                cv2.imencode(".png", record.image)
                good += 1
    return good, time.perf_counter() - started


def mnist_cnn_consumption(batch_size: int, images: int) -> float:
    import numpy as np
    import tensorflow as tf

    from training.models import build_model

    x = np.random.default_rng(0).random((images, 28, 28, 1), dtype=np.float32)
    y = np.random.default_rng(1).integers(0, 10, images)
    model = build_model("mnist_cnn", seed=0)
    model.compile(tf.keras.optimizers.Adadelta(1.0), "sparse_categorical_crossentropy")
    model.fit(x[: batch_size * 5], y[: batch_size * 5], batch_size=batch_size, verbose=0)  # warm up
    started = time.perf_counter()
    model.fit(x, y, batch_size=batch_size, epochs=1, verbose=0)
    return images / (time.perf_counter() - started)


def reader_rate(url: str, batch_size: int, images: int) -> float:
    from training.reader import open_dataset

    with open_dataset(url, batch_size=batch_size) as dataset:
        iterator = iter(dataset)
        next(iterator)  # warm up: the first batch pays for opening files and tracing
        started, seen = time.perf_counter(), 0
        while seen < images:
            seen += int(next(iterator)[0].shape[0])
    return seen / (time.perf_counter() - started)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=10000)
    parser.add_argument("--batch-size", type=int, default=64)
    args = parser.parse_args(argv)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")

    from infra.spark import get_spark
    from tasks.preprocess import PreprocessConfig, preprocess_images

    workdir = Path(tempfile.mkdtemp(prefix="hvdflow-bench-preprocess-"))
    try:
        print(f"writing {args.images} JPEG files (64x64 RGB) ...", flush=True)
        make_images(workdir / "images", args.images)
        spark = get_spark("local[2]", "hvdflow-bench", {"spark.ui.showConsoleProgress": "false"})
        spark.sparkContext.setLogLevel("ERROR")
        config = PreprocessConfig(
            input=str(workdir / "images"), output=str(workdir / "out"), image_size=(28, 28)
        )
        started = time.perf_counter()
        manifest = preprocess_images(spark, config)
        spark_s = time.perf_counter() - started
        spark_rows = manifest.train_rows + manifest.val_rows
        loop_rows, loop_s = pillow_loop(workdir / "images", (28, 28), "L")
        print(f"\npreprocessing {spark_rows} images to 28x28 grayscale:")
        print(f"  Spark job, local[2] (incl. Parquet write)  {spark_rows / spark_s:8.1f} images/s")
        print(f"  single-process Pillow loop (no write)      {loop_rows / loop_s:8.1f} images/s")
        print(f"  ratio Spark / loop                         {loop_s / spark_s:8.2f}")

        read = reader_rate(manifest.train_url, args.batch_size, manifest.train_rows * 2)
        consume = mnist_cnn_consumption(args.batch_size, min(8000, manifest.train_rows))
        print(f"\nreading the train split (batch {args.batch_size}, one rank):")
        print(f"  Petastorm reader -> tf.data                {read:8.1f} images/s")
        print(f"  MNIST CNN training consumes                {consume:8.1f} images/s")
        print(f"  ratio reader / CNN                         {read / consume:8.2f}")
        spark.stop()
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
