"""Batch scoring throughput: the Spark scoring job against a single-process predict loop.

The same model (a Keras CNN of training/models.py, seeded weights, 224x224 RGB input, saved in
MLflow's format) scores the same Caltech101-like JPEGs (~300x200, resized to 224x224) two ways,
in one run:

1. ``tasks.score.job.score_images`` on Spark local[2]: the whole call (listing, the Spark job,
   Parquet writes by the executors, publication). The session is warm: a first, smaller run
   started the Python workers and loaded the model in each, as in a long-lived session.
2. A loop in one process doing the same per-image work (read, decode and resize with
   preprocessing's rules) and calling the same model's ``predict`` on batches of the same size,
   TensorFlow using every core; its predictions written to one Parquet file.

Each way runs ``--rounds`` times, interleaved; the best of each is shown (the machine is shared
and noisy: the best is the least disturbed).

    .venv/bin/python -m bench.score_throughput
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

IMAGE_SIZE = (224, 224)
CLASSES = 10


def save_model(name: str, folder: Path):
    """The model, built with seeded weights and saved with MLflow (as training logs it)."""
    import mlflow.tensorflow
    import numpy as np
    from mlflow.models import infer_signature

    from tasks.score.model import local_model
    from training.models import build_model

    keras_model = build_model(name, (*IMAGE_SIZE, 3), CLASSES, seed=0)
    example = np.random.default_rng(0).random((2, *IMAGE_SIZE, 3), dtype=np.float32)
    signature = infer_signature(example, keras_model.predict(example, verbose=0))
    mlflow.tensorflow.save_model(keras_model, str(folder), signature=signature)
    labels = [f"class_{i}" for i in range(CLASSES)]
    return local_model(str(folder), f"bench-{name}", "1", labels)


def spark_run(spark, model, images: Path, out: Path, batch_size: int):
    from tasks.score.config import ScoreConfig
    from tasks.score.job import score_images

    config = ScoreConfig(input=str(images), output=str(out), batch_size=batch_size)
    started = time.perf_counter()
    result = score_images(spark, config, model)
    return result, time.perf_counter() - started


def loop_run(keras_model, images: Path, out: Path, batch_size: int) -> tuple[int, float, float]:
    """(images scored, seconds, seconds in predict) of the single-process loop."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    from tasks.preprocess.decode import Good, decode_image
    from tasks.score.executor import prediction_schema, to_model_input
    from tasks.score.inputs import list_images

    started = time.perf_counter()
    in_predict = 0.0
    sources, classes, probabilities = [], [], []
    batch, batch_sources = [], []

    def predict():
        nonlocal in_predict
        began = time.perf_counter()
        p = keras_model.predict(to_model_input(batch), batch_size=batch_size, verbose=0)
        in_predict += time.perf_counter() - began
        best = p.argmax(axis=1)
        sources.extend(batch_sources)
        classes.extend(best.tolist())
        probabilities.extend(p[np.arange(len(best)), best].tolist())
        batch.clear()
        batch_sources.clear()

    for unit in list_images(str(images)).units:
        with open(unit.path, "rb") as f:
            record = decode_image(unit.source, "", f.read(), IMAGE_SIZE, "RGB", 50_000_000)
        if isinstance(record, Good):
            batch.append(record.image)
            batch_sources.append(unit.source)
            if len(batch) == batch_size:
                predict()
    if batch:
        predict()
    table = pa.table(
        {
            "source": sources,
            "class_name": [f"class_{c}" for c in classes],
            "class_index": classes,
            "probability": probabilities,
        },
        schema=prediction_schema(),
    )
    out.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, out / "predictions.parquet")
    return len(sources), time.perf_counter() - started, in_predict


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=600)
    parser.add_argument("--model", default="mnist_cnn", help="a model of training/models.py")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=64)
    args = parser.parse_args(argv)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")

    from bench.preprocess_throughput import make_caltech_like
    from infra.spark import get_spark

    workdir = Path(tempfile.mkdtemp(prefix="hvdflow-bench-score-"))
    try:
        print(f"writing {args.images} images and saving {args.model} ...", flush=True)
        make_caltech_like(workdir / "images", args.images)
        make_caltech_like(workdir / "warmup", 40)
        model = save_model(args.model, workdir / "model")
        spark = get_spark("local[2]", "hvdflow-bench", {"spark.ui.showConsoleProgress": "false"})
        spark.sparkContext.setLogLevel("ERROR")
        # Warm-up: the executors' Python workers start and load the model (once each).
        _, cold_s = spark_run(spark, model, workdir / "warmup", workdir / "out-warmup", 16)
        print(f"  warm-up (40 images; workers start, model loaded): {cold_s:.1f} s", flush=True)

        import mlflow.tensorflow
        import numpy as np

        keras_model = mlflow.tensorflow.load_model(model.local_dir)
        keras_model.predict(np.zeros((2, *IMAGE_SIZE, 3), "float32"), verbose=0)  # tracing

        spark_rates, loop_rates, split = [], [], {}
        for round_ in range(args.rounds):
            result, spark_s = spark_run(
                spark, model, workdir / "images", workdir / f"out-{round_}", args.batch_size
            )
            spark_rates.append(result.scored / spark_s)
            rows, loop_s, predict_s = loop_run(
                keras_model, workdir / "images", workdir / f"loop-{round_}", args.batch_size
            )
            loop_rates.append(rows / loop_s)
            if spark_rates[-1] == max(spark_rates):
                split["spark"] = result.milliseconds
            if loop_rates[-1] == max(loop_rates):
                split["loop"] = (predict_s, loop_s - predict_s)
            print(
                f"  round {round_ + 1}: Spark {spark_rates[-1]:6.1f} images/s, loop "
                f"{loop_rates[-1]:6.1f} images/s",
                flush=True,
            )
        spark.stop()

        load = ", ".join(f"{v:.2f}" for v in os.getloadavg())
        best_spark, best_loop = max(spark_rates), max(loop_rates)
        label = f"{result.scored} ~300x200 JPEG -> 224x224 RGB, {args.model}"
        print(f"\nscoring, best of {args.rounds} rounds (images/s; load average {load}):")
        print(f"  {'workload':<46} {'Spark local[2]':>15} {'predict loop':>13} {'ratio':>6}")
        print(f"  {label:<46} {best_spark:15.1f} {best_loop:13.1f} {best_spark / best_loop:6.2f}")
        seconds = {k: v / 1000 for k, v in split["spark"].items()}
        print(
            f"  Spark tasks' time (both slots, s): predict {seconds.get('predict', 0):.1f}, "
            f"fetch+decode+write {seconds.get('fetch_decode_write', 0):.1f}, "
            f"model load {seconds.get('load', 0):.1f}"
        )
        predict_s, rest_s = split["loop"]
        print(f"  loop's time (s): predict {predict_s:.1f}, read+decode+write {rest_s:.1f}")
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
