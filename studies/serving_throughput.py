"""The registered model in its consumers' hands: ``mlflow models serve`` latency and throughput,
and ``score_udf`` against ``hvdflow score`` on the same images, in one run on this machine.

1. A seeded ``mnist_cnn`` (28x28 grayscale, what the pipeline's MNIST recipe registers) is
   logged as hvdflow's ImageClassifier to a throwaway registry (SQLite in a temporary folder)
   and becomes ``champion``: the same pyfunc, requirements and image code as a trained one.
2. ``mlflow models serve --env-manager local`` serves it; PNG files are POSTed base64 in JSON,
   one image per request (latency: median and 95th percentile) and 32 per request (images/s).
3. The same ``--images`` PNG files (scikit-learn's digits, upscaled and repeated) are scored on
   Spark local[2] by ``hvdflow score`` (``score_images``: listing, the job, Parquet written by
   the executors, publication) and by ``score_udf`` on a ``binaryFile`` DataFrame written to
   Parquet, three ways: ``udf_bytes`` on a cached table of the files' bytes (one partition per
   slot: the UDF's own cost), ``udf_paths`` on a column of paths (the UDF reads each file, as
   hvdflow score's tasks do), ``udf_binaryfile`` straight on a ``binaryFile`` read as Spark
   partitions it (it packs small files by ``spark.sql.files.openCostInBytes``, 4 MB each:
   dozens of tasks for 2,000 small images). The session is warm (a first small run loaded the
   model in each Python worker); ``--rounds`` interleaved rounds, the best of each shown.

    .venv/bin/python -m studies.serving_throughput
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import numpy as np

from hvdflow.infra.ports import unclaimed_port
from hvdflow.infra.tracking import CHAMPION
from hvdflow.serving.package import log_classifier
from hvdflow.training.models import build_model

NAME = "bench-serving"
SIDE = 28


def write_images(folder: Path, count: int) -> list[Path]:
    """``count`` PNG files of scikit-learn's digits at 28x28, in class sub-folders."""
    from PIL import Image
    from sklearn.datasets import load_digits

    digits = load_digits()
    paths = []
    for i in range(count):
        j = i % len(digits.images)
        pixels = (digits.images[j] * 255 / 16).astype(np.uint8)
        image = Image.fromarray(pixels, "L").resize((SIDE, SIDE), Image.BILINEAR)
        path = folder / str(digits.target[j]) / f"{i:05d}.png"
        path.parent.mkdir(parents=True, exist_ok=True)
        image.save(path)
        paths.append(path)
    return paths


def register(tracking_uri: str, artifacts: Path) -> str:
    import mlflow
    from mlflow import MlflowClient

    network = build_model("mnist_cnn", (SIDE, SIDE, 1), 10, seed=0)
    example = np.random.default_rng(0).random((2, SIDE, SIDE, 1), dtype=np.float32)
    mlflow.set_tracking_uri(tracking_uri)
    experiment = MlflowClient(tracking_uri).create_experiment(
        NAME, artifact_location=artifacts.as_uri()
    )
    with mlflow.start_run(experiment_id=experiment):
        info = log_classifier(network, [str(d) for d in range(10)], example, NAME)
    version = str(info.registered_model_version)
    MlflowClient(tracking_uri).set_registered_model_alias(NAME, CHAMPION, version)
    return version


def serve(tracking_uri: str, port: int) -> subprocess.Popen:
    mlflow_cli = Path(sys.executable).parent / "mlflow"
    server = subprocess.Popen(
        [str(mlflow_cli), "models", "serve", "-m", f"models:/{NAME}@champion"]
        + ["-p", str(port), "--host", "127.0.0.1", "--env-manager", "local"],
        # The server runs uvicorn from PATH: this environment's.
        env={
            **os.environ,
            "MLFLOW_TRACKING_URI": tracking_uri,
            "PATH": f"{mlflow_cli.parent}:{os.environ.get('PATH', '')}",
        },
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/ping", timeout=2):
                return server
        except OSError:
            if server.poll() is not None:
                why = server.stderr.read()[-2000:]
                raise RuntimeError(f"mlflow models serve exited: {why}") from None
            time.sleep(1)
    server.kill()
    raise RuntimeError("mlflow models serve did not answer within 300 s")


def post(port: int, files: list[bytes]) -> float:
    """Seconds for one request scoring ``files``."""
    body = json.dumps(
        {
            "dataframe_split": {
                "columns": ["image"],
                "data": [[base64.b64encode(data).decode()] for data in files],
            }
        }
    ).encode()
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/invocations",
        data=body,
        headers={"Content-Type": "application/json"},
    )
    started = time.perf_counter()
    with urllib.request.urlopen(request, timeout=300) as response:
        answers = json.loads(response.read())["predictions"]
    elapsed = time.perf_counter() - started
    if len(answers) != len(files) or any(a.get("error") for a in answers):
        raise RuntimeError(f"the served model answered {answers[:2]}...")
    return elapsed


def served(tracking_uri: str, files: list[bytes], singles: int, batches: int) -> dict:
    port = unclaimed_port("127.0.0.1")
    server = serve(tracking_uri, port)
    try:
        post(port, files[:1])  # the first request traces the network
        latencies = [post(port, [files[i % len(files)]]) for i in range(singles)]
        batch_s = [post(port, files[i * 32 : (i + 1) * 32]) for i in range(batches)]
    finally:
        server.terminate()
        server.wait(30)
    latencies.sort()
    return {
        "p50_ms": 1000 * statistics.median(latencies),
        "p95_ms": 1000 * latencies[int(0.95 * (len(latencies) - 1))],
        "single_images_per_s": len(latencies) / sum(latencies),
        "batch32_images_per_s": 32 * len(batch_s) / sum(batch_s),
    }


def spark_rates(tracking_uri: str, folder: Path, workdir: Path, count: int, rounds: int):
    from hvdflow.infra.spark import get_spark  # noqa: PLC0415 (lazy: it loads Spark)
    from hvdflow.tasks.score.config import ModelRef, ScoreConfig  # noqa: PLC0415 (lazy: it loads NumPy)
    from hvdflow.tasks.score.job import score_images  # noqa: PLC0415 (lazy: it loads NumPy)
    from hvdflow.tasks.score.model import fetch_model  # noqa: PLC0415 (lazy: it loads NumPy)
    from hvdflow.tasks.score.udf import score_udf  # noqa: PLC0415 (lazy: it loads NumPy)

    spark = get_spark("local[2]", app_name="hvdflow-bench-serving")
    model = fetch_model(ModelRef(name=NAME), tracking_uri, str(workdir / "model"))
    predict = score_udf(f"models:/{NAME}@champion", spark=spark, tracking_uri=tracking_uri)
    warm = workdir / "warm"
    write_images(warm, 40)
    score_images(spark, ScoreConfig(input=str(warm), output=str(workdir / "warm-out")), model)
    spark.read.format("binaryFile").load(f"{warm}/*/*.png").select(
        predict("content").alias("p")
    ).write.mode("overwrite").parquet(str(workdir / "warm-udf"))

    slots = spark.sparkContext.defaultParallelism
    files = sorted(str(path) for path in folder.glob("*/*.png"))
    # A table of image bytes (a Delta table, a join): read once, one partition per slot.
    table = spark.read.format("binaryFile").load(f"{folder}/*/*.png").repartition(slots).cache()
    table.count()
    paths = spark.createDataFrame([(f,) for f in files], "path string").repartition(slots)
    ways = {
        "udf_bytes": lambda: table.select("path", predict("content").alias("p")),
        "udf_paths": lambda: paths.select("path", predict("path").alias("p")),
        "udf_binaryfile": lambda: (
            spark.read.format("binaryFile")
            .load(f"{folder}/*/*.png")
            .select("path", predict("content").alias("p"))
        ),
    }
    rates: dict[str, list[float]] = {"score": [], **{name: [] for name in ways}}
    for round_ in range(rounds):
        config = ScoreConfig(input=str(folder), output=str(workdir / f"score-{round_}"))
        started = time.perf_counter()
        result = score_images(spark, config, model)
        rates["score"].append(result.scored / (time.perf_counter() - started))
        for name, frame in ways.items():
            started = time.perf_counter()
            frame().write.mode("overwrite").parquet(str(workdir / f"{name}-{round_}"))
            rates[name].append(count / (time.perf_counter() - started))
        print(
            f"  round {round_ + 1}: "
            + ", ".join(f"{name} {values[-1]:.1f}" for name, values in rates.items())
            + " images/s",
            flush=True,
        )
    spark.stop()
    return {name: max(values) for name, values in rates.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--images", type=int, default=2000)
    parser.add_argument("--singles", type=int, default=200, help="one-image requests")
    parser.add_argument("--batches", type=int, default=30, help="32-image requests")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)

    workdir = Path(tempfile.mkdtemp(prefix="hvdflow-bench-serving-"))
    try:
        tracking_uri = f"sqlite:///{workdir / 'mlflow.db'}"
        os.environ["MLFLOW_TRACKING_URI"] = tracking_uri
        version = register(tracking_uri, workdir / "artifacts")
        paths = write_images(workdir / "images", args.images)
        files = [path.read_bytes() for path in paths]
        print(f"models:/{NAME}/{version} (mnist_cnn, 28x28 L), {len(files)} PNG files")
        s = served(tracking_uri, files, args.singles, args.batches)
        print(
            f"mlflow models serve: one image per request p50 {s['p50_ms']:.1f} ms, p95 "
            f"{s['p95_ms']:.1f} ms ({s['single_images_per_s']:.1f} images/s); 32 per request "
            f"{s['batch32_images_per_s']:.1f} images/s",
            flush=True,
        )
        rates = spark_rates(tracking_uri, workdir / "images", workdir, len(files), args.rounds)
        print(f"Spark local[2], best of {args.rounds} (images/s, and against hvdflow score):")
        for name, rate in rates.items():
            print(f"  {name:15s} {rate:7.1f}  {rate / rates['score']:.2f}x")
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
