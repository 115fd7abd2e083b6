"""Batch scoring throughput: the Spark scoring job against a single-process predict loop.

    .venv/bin/python -m studies.score_throughput [--images 2000] [--rounds 3]

Each model (seeded, 224x224 RGB input, MLflow's format) scores the same Caltech101-like JPEGs
three ways, interleaved, best of the rounds: ``score_images`` on a warm Spark local[2]; one
process reading, decoding and calling ``predict``; and the forward pass alone, one two-thread
process against two one-thread processes at once.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from hvdflow.serving.images import model_input
from hvdflow.training.models import build_model
from hvdflow.training.threads import use_threads
from studies.preprocess_throughput import make_caltech_like

IMAGE_SIZE = (224, 224)
CLASSES = 10


def save_model(name: str, folder: Path):
    """The model, built with seeded weights and saved with MLflow (as training logs it)."""
    import mlflow.tensorflow
    from mlflow.models import infer_signature

    from hvdflow.tasks.score.model import local_model  # noqa: PLC0415 (lazy: it loads NumPy)

    keras_model = build_model(name, (*IMAGE_SIZE, 3), CLASSES, seed=0)
    example = np.random.default_rng(0).random((2, *IMAGE_SIZE, 3), dtype=np.float32)
    signature = infer_signature(example, keras_model.predict(example, verbose=0))
    mlflow.tensorflow.save_model(keras_model, str(folder), signature=signature)
    labels = [f"class_{i}" for i in range(CLASSES)]
    return local_model(str(folder), f"bench-{name}", "1", labels)


def spark_run(spark, model, images: Path, out: Path, batch_size: int):
    from hvdflow.tasks.score.config import ScoreConfig  # noqa: PLC0415 (lazy: it loads NumPy)
    from hvdflow.tasks.score.job import score_images  # noqa: PLC0415 (lazy: it loads NumPy)

    config = ScoreConfig(input=str(images), output=str(out), batch_size=batch_size)
    started = time.perf_counter()
    result = score_images(spark, config, model)
    return result, time.perf_counter() - started


def loop_run(keras_model, units, out: Path, batch_size: int) -> tuple[int, float, float]:
    """(images scored, seconds, seconds in predict) of the single-process loop over ``units``."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from hvdflow.tasks.images.decode import Good, decode_image  # noqa: PLC0415 (lazy: it loads NumPy)
    from hvdflow.tasks.score.executor import prediction_schema  # noqa: PLC0415 (lazy: it loads NumPy)

    started = time.perf_counter()
    in_predict = 0.0
    sources, classes, probabilities = [], [], []
    batch, batch_sources = [], []

    def predict():
        nonlocal in_predict
        began = time.perf_counter()
        p = keras_model.predict(model_input(batch), batch_size=batch_size, verbose=0)
        in_predict += time.perf_counter() - began
        best = p.argmax(axis=1)
        sources.extend(batch_sources)
        classes.extend(best.tolist())
        probabilities.extend(p[np.arange(len(best)), best].tolist())
        batch.clear()
        batch_sources.clear()

    for unit in units:
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


def forward_seconds(keras_model, batches: int, batch_size: int) -> float:
    """Seconds for ``batches`` forward passes of ``batch_size`` images held in memory, with
    ``predict_on_batch`` as the executors call it: the forward pass and nothing else."""
    x = np.random.default_rng(0).random((batch_size, *IMAGE_SIZE, 3), dtype=np.float32)
    keras_model.predict_on_batch(x[:2])  # tracing
    started = time.perf_counter()
    for _ in range(batches):
        keras_model.predict_on_batch(x)
    return time.perf_counter() - started


def _one_thread_forward(model_dir: str, batches: int, batch_size: int, ready, results) -> None:
    import mlflow.tensorflow

    use_threads(1)  # as a Spark task with spark.task.cpus = 1 (hvdflow.tasks.score.model_cache)
    keras_model = mlflow.tensorflow.load_model(model_dir)
    forward_seconds(keras_model, 1, 2)
    ready.wait()
    results.put(forward_seconds(keras_model, batches, batch_size))


def forward_pass_rates(keras_model, model_dir: str, images: int, batch_size: int):
    """images/s of the forward pass alone: (one process with TensorFlow's threads on every core,
    two one-thread processes at once with half the batches each).

    Their ratio is what two one-core slots can gain over one process on the forward pass, on
    this machine, whatever runs them: the measure of how far a job like Spark's can go.
    """
    batches = max(2, images // batch_size // 2 * 2)
    one = batches * batch_size / forward_seconds(keras_model, batches, batch_size)
    context = multiprocessing.get_context("spawn")
    ready, results = context.Barrier(3), context.Queue()
    workers = [
        context.Process(
            target=_one_thread_forward,
            args=(model_dir, batches // 2, batch_size, ready, results),
        )
        for _ in range(2)
    ]
    for worker in workers:
        worker.start()
    ready.wait(timeout=600)
    slowest = max(results.get(timeout=3600) for _ in workers)
    for worker in workers:
        worker.join()
    return one, batches * batch_size / slowest


def measure(spark, name: str, workdir: Path, units, rounds: int, batch_size: int) -> dict:
    """One model's rounds of the three ways; the best rate of each and where the time went."""
    import mlflow.tensorflow

    print(f"{name}:", flush=True)
    model = save_model(name, workdir / f"model-{name}")
    # Warm-up: the executors' Python workers load the model (once each), as in a warm session.
    _, cold_s = spark_run(spark, model, workdir / "warmup", workdir / f"warmup-{name}", 16)
    print(f"  warm-up (40 images; the executors load the model): {cold_s:.1f} s", flush=True)
    keras_model = mlflow.tensorflow.load_model(model.local_dir)
    keras_model.predict(np.zeros((2, *IMAGE_SIZE, 3), "float32"), verbose=0)  # tracing

    rates: dict[str, list[float]] = {"spark": [], "loop": [], "forward1": [], "forward2": []}
    split = {}
    for round_ in range(rounds):
        out = workdir / f"{name}-{round_}"
        result, spark_s = spark_run(spark, model, workdir / "images", out / "spark", batch_size)
        rates["spark"].append(result.scored / spark_s)
        rows, loop_s, predict_s = loop_run(keras_model, units, out / "loop", batch_size)
        rates["loop"].append(rows / loop_s)
        one, two = forward_pass_rates(keras_model, model.local_dir, len(units), batch_size)
        rates["forward1"].append(one)
        rates["forward2"].append(two)
        if rates["spark"][-1] == max(rates["spark"]):
            split["spark"] = {k: v / 1000 for k, v in result.milliseconds.items()}
        if rates["loop"][-1] == max(rates["loop"]):
            split["loop"] = (predict_s, loop_s - predict_s)
        print(
            f"  round {round_ + 1}: Spark {rates['spark'][-1]:6.1f} images/s, loop "
            f"{rates['loop'][-1]:6.1f}; forward pass alone: one process {one:6.1f}, two "
            f"one-thread processes {two:6.1f}",
            flush=True,
        )
    return {"name": name, "scored": result.scored, "rates": rates, "split": split}


def report(results: list[dict], rounds: int) -> None:
    load = ", ".join(f"{v:.2f}" for v in os.getloadavg())
    print(f"\nscoring, best of {rounds} rounds (images/s; load average {load}):")
    print(
        f"  {'model':<11} {'images':>6} {'Spark local[2]':>15} {'predict loop':>13} {'ratio':>6}"
        f" {'forward: 1 process':>19} {'2x1-thread':>11} {'ratio':>6}"
    )
    for r in results:
        spark, loop, one, two = (
            max(r["rates"][k]) for k in ("spark", "loop", "forward1", "forward2")
        )
        print(
            f"  {r['name']:<11} {r['scored']:>6} {spark:15.1f} {loop:13.1f} {spark / loop:6.2f}"
            f" {one:19.1f} {two:11.1f} {two / one:6.2f}"
        )
    print("  (images: ~300x200 JPEGs decoded and resized to 224x224 RGB)")
    for r in results:
        spark, (predict_s, rest_s) = r["split"]["spark"], r["split"]["loop"]
        print(
            f"  {r['name']}: Spark tasks' time (both slots, s): predict "
            f"{spark.get('predict', 0):.1f}, fetch+decode+write "
            f"{spark.get('fetch_decode_write', 0):.1f}; loop's time (s): predict "
            f"{predict_s:.1f}, read+decode+write {rest_s:.1f}"
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=600)
    parser.add_argument(
        "--models",
        default="mnist_cnn,digits_mlp",
        help="models of training/models.py, comma-separated (default: a CNN whose forward pass "
        "is the work, and an MLP for which decoding is)",
    )
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=64)
    args = parser.parse_args(argv)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")

    from hvdflow.infra.spark import get_spark  # noqa: PLC0415 (lazy: it loads Spark)
    from hvdflow.tasks.score.inputs import list_images  # noqa: PLC0415 (lazy: it loads NumPy)

    workdir = Path(tempfile.mkdtemp(prefix="hvdflow-bench-score-"))
    try:
        print(f"writing {args.images} images ...", flush=True)
        make_caltech_like(workdir / "images", args.images)
        make_caltech_like(workdir / "warmup", 40)
        units = list_images(str(workdir / "images")).units
        spark = get_spark("local[2]", "hvdflow-bench", {"spark.ui.showConsoleProgress": "false"})
        spark.sparkContext.setLogLevel("ERROR")
        results = [
            measure(spark, name, workdir, units, args.rounds, args.batch_size)
            for name in args.models.split(",")
        ]
        spark.stop()
        report(results, args.rounds)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
