"""Scoring any DataFrame: a column expression, as Spark's ``predict_batch_udf`` gives.

Each row of image bytes or paths gets a struct of ``class_name``, ``class_index``,
``probability`` and ``error`` (why that row's image could not be read; one bad image never fails
the job). The pieces are ``hvdflow score``'s: the model shipped once as a Spark archive, kept per
executor process (``model_cache``), images decoded by ``hvdflow.serving.images``.
"""

from __future__ import annotations

import numpy as np

from hvdflow.infra.tracking import tracking_uri as default_tracking_uri
from hvdflow.serving.images import MAX_PIXELS, UnreadableImage, decode, model_input
from hvdflow.tasks.score import model_cache
from hvdflow.tasks.score.config import ModelRef
from hvdflow.tasks.score.job import ship_model
from hvdflow.tasks.score.model import fetch_model, image_settings

RESULT_TYPE = "class_name string, class_index int, probability float, error string"
BATCH_SIZE = 64  # images per forward pass on an executor


def score_udf(
    model_uri: str = "models:/hvdflow-classifier@champion",
    *,
    spark=None,
    tracking_uri: str | None = None,
    image_size: tuple[int, int] | None = None,
    batch_size: int = BATCH_SIZE,
    max_pixels: int = MAX_PIXELS,
):
    """A pandas UDF scoring a column of image bytes or paths with ``model_uri`` (a registered
    version, ``models:/<name>@<alias>`` or ``models:/<name>/<version>``).

    ``spark``: the session whose executors score (default: the active one). ``tracking_uri``:
    the registry (default: ``MLFLOW_TRACKING_URI``). ``image_size``: only for a model that
    takes any size. Use it as any column expression::

        images = spark.read.format("binaryFile").load("s3a://bucket/new/")
        scored = images.withColumn("prediction", score_udf()("content"))
        scored.select("path", "prediction.class_name", "prediction.probability")

    For many small files, a column of paths is faster: Spark packs a ``binaryFile`` read as if
    each file cost ``spark.sql.files.openCostInBytes`` (4 MB), dozens of tasks for a few thousand.
    """
    from pyspark.sql import SparkSession
    from pyspark.sql.functions import pandas_udf

    spark = spark or SparkSession.active()
    model = fetch_model(ModelRef.from_uri(model_uri), tracking_uri or default_tracking_uri())
    size, color_mode = image_settings(model, image_size)
    archive = ship_model(spark, model)
    key, labels = model.cache_key, model.labels

    @pandas_udf(RESULT_TYPE)
    def score(values):
        from pyspark import TaskContext

        context = TaskContext.get()
        threads = max(1, context.cpus()) if context else 1
        predict_proba = model_cache.cached_model(key, archive, threads)
        return score_values(values, predict_proba, labels, size, color_mode, max_pixels, batch_size)

    return score


def score_values(values, predict_proba, labels, image_size, color_mode, max_pixels, batch_size):
    """One Arrow batch: a pandas Series of bytes or paths to a DataFrame of RESULT_TYPE."""
    import pandas as pd

    images, errors = [], []
    for value in values:
        try:
            images.append(decode(_image_bytes(value), image_size, color_mode, max_pixels))
            errors.append(None)
        except UnreadableImage as e:
            errors.append(e.reason)
        except OSError as e:
            errors.append(f"cannot read {value!r}: {e.strerror or e}")
    probabilities = [
        np.asarray(predict_proba(model_input(images[i : i + batch_size])))
        for i in range(0, len(images), batch_size)
    ]
    good = iter(np.concatenate(probabilities) if probabilities else [])
    rows = []
    for error in errors:
        if error is not None:
            rows.append((None, None, None, error))
            continue
        vector = next(good)
        best = int(vector.argmax())
        rows.append((labels[best], best, float(vector[best]), None))
    frame = pd.DataFrame(rows, columns=["class_name", "class_index", "probability", "error"])
    frame["class_index"] = frame["class_index"].astype("Int32")
    frame["probability"] = frame["probability"].astype("Float32")
    return frame


def _image_bytes(value) -> bytes:
    """A cell's image: its bytes, or the file a path (``file:`` URLs too) names."""
    if value is None:
        raise UnreadableImage("no image (null)")
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value)
    path = str(value).removeprefix("file://").removeprefix("file:")
    with open(path, "rb") as f:
        return f.read()
