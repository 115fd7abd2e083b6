"""Scoring on the session's local[2] Spark with models in a real MLflow registry over HTTP:
held-out images with bad files, a preprocessed dataset, and models that do not fit."""

from __future__ import annotations

import csv
import io
import json
import uuid
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from hvdflow.tasks.score.config import ModelRef, ScoreConfig
from hvdflow.tasks.score.job import score_images
from hvdflow.tasks.score.model import fetch_model
from tests.tasks.score.helpers import (
    BAD_FILES,
    model_predictions,
    read_files,
    register_model,
    write_digits,
)

pytestmark = pytest.mark.integration

ARROW_BATCH = "spark.sql.execution.arrow.maxRecordsPerBatch"
SPLITS = ("train", "val")


@pytest.fixture(scope="module")
def digits_model(mlflow_server):
    """An (untrained, seeded) digits MLP registered as champion: (name, version)."""
    name = f"tests-score-{uuid.uuid4().hex[:6]}"
    return name, register_model(mlflow_server.tracking_uri, name)


def test_a_version_registered_before_the_model_carried_its_labels_still_scores(
    spark, mlflow_server, tmp_path
):
    name = f"tests-score-legacy-{uuid.uuid4().hex[:6]}"
    version = register_model(mlflow_server.tracking_uri, name, legacy=True)
    root = tmp_path / "heldout"
    good = write_digits(root, range(1400, 1420), bad=False)
    model = fetch_model(ModelRef(name=name), mlflow_server.tracking_uri, str(tmp_path / "m"))
    assert model.uri == f"models:/{name}/{version}" and model.labels[3] == "digit-3"
    result = score_images(spark, ScoreConfig(input=str(root), output=str(tmp_path / "o")), model)
    table = pq.read_table(result.predictions_url).sort_by("source")
    classes, probabilities = model_predictions(model.uri, read_files(root, good), (8, 8), "L")
    assert table.column("class_index").to_pylist() == classes.tolist()
    np.testing.assert_allclose(table.column("probability").to_numpy(), probabilities, rtol=1e-5)


def spark_jobs_so_far(spark) -> int:
    return spark.sparkContext._jsc.sc().statusStore().jobsList(None).size()


def read_s3_predictions(store, url: str):
    """Every part file of a predictions folder in the bucket, as one table, sorted by source."""
    import pyarrow as pa

    bucket, prefix = url.removeprefix("s3://").split("/", 1)
    keys = sorted(store.list_keys(prefix + "/"))
    names = [key.rsplit("/", 1)[1] for key in keys]
    tables = [
        pq.read_table(io.BytesIO(store.get_bytes(f"s3://{bucket}/{key}")))
        for key in keys
        if key.endswith(".parquet")
    ]
    return names, pa.concat_tables(tables).sort_by("source")


def test_every_good_image_gets_one_prediction_equal_to_the_models_own_predict(
    spark, mlflow_server, store, digits_model, tmp_path
):
    name, version = digits_model
    root = tmp_path / "heldout"
    good = write_digits(root, range(1400, 1460))
    model = fetch_model(ModelRef(name=name), mlflow_server.tracking_uri, str(tmp_path / "m"))
    assert (model.uri, model.aliases) == (f"models:/{name}/{version}", ("champion",))
    output = f"s3://hvdflow-tests/{tmp_path.name}/scores"
    config = ScoreConfig(input=str(root), output=output, batch_size=8)

    # Several Arrow batches per task, several predict calls per batch: one model load each.
    spark.conf.set(ARROW_BATCH, "5")
    try:
        first = score_images(spark, config, model)
    finally:
        spark.conf.unset(ARROW_BATCH)

    assert (first.scored, first.quarantined) == (len(good), len(BAD_FILES))
    names, table = read_s3_predictions(store, first.predictions_url)
    assert "_SUCCESS" in names
    assert table.schema.names == ["source", "class_name", "class_index", "probability"]
    assert table.column("source").to_pylist() == good  # every good image, exactly once
    classes, probabilities = model_predictions(model.uri, read_files(root, good), (8, 8), "L")
    assert table.column("class_index").to_pylist() == classes.tolist()
    np.testing.assert_allclose(table.column("probability").to_numpy(), probabilities, rtol=1e-5)
    assert table.column("class_name").to_pylist() == [f"digit-{c}" for c in classes]
    assert first.counts == {
        f"digit-{c}": int(n) for c, n in zip(*np.unique(classes, return_counts=True), strict=True)
    }

    # The bad files are in the quarantine report with their reasons, and the manifest in the
    # output names the attempt, the model version and the counts.
    report = store.get_bytes(first.quarantine_path).decode()
    rows = {r["source"]: r["reason"] for r in csv.DictReader(io.StringIO(report))}
    assert sorted(rows) == sorted(BAD_FILES)
    assert rows["3/broken.png"].startswith("corrupt or truncated image")
    assert "text file" in rows["notes.txt"] or "not an image" in rows["notes.txt"]
    manifest = json.loads(store.get_bytes(f"{output}/manifest.json"))
    assert manifest["predictions_url"] == first.predictions_url
    assert manifest["model"]["uri"] == model.uri and manifest["rows"] == len(good)

    # No executor imported horovod, and each loaded the model once for all its batches.
    assert first.executors and not any(e["horovod"] for e in first.executors)
    # Keras' predict went through AutoGraph, whose module files the workers did not leave in
    # /tmp (a PySpark worker ends with os._exit, before AutoGraph's own atexit clean-up).
    assert any(e["autograph_modules"] for e in first.executors), first.executors
    assert not any(e["autograph_files_left"] for e in first.executors), first.executors
    loads = {(e["host"], e["pid"]): e["loads"] for e in first.executors}
    # A second run in the same Spark session reuses the processes' models: no new load.
    second = score_images(
        spark, config.model_copy(update={"output": str(tmp_path / "local")}), model
    )
    again = {(e["host"], e["pid"]): e["loads"] for e in second.executors}
    assert set(again) & set(loads), (loads, again)
    assert all(again[p] == loads[p] for p in set(again) & set(loads))
    local = pq.read_table(second.predictions_url).sort_by("source")
    assert local.column("source").to_pylist() == good
    assert (Path(second.predictions_url) / "_SUCCESS").exists()
    # The new manifest replaced the old one; the attempt it named is gone.
    assert json.loads((tmp_path / "local" / "manifest.json").read_text())["attempt"] == (
        second.attempt
    )


def test_a_preprocessed_dataset_is_scored_by_row_group(
    spark, mlflow_server, store, digits_model, digits_dataset, tmp_path
):
    name, version = digits_model
    model = fetch_model(ModelRef(name=name, version=version), mlflow_server.tracking_uri)
    # The version folder (holding manifest.json): every split of its dataset.
    version_folder = str(Path(digits_dataset.path).parent)
    config = ScoreConfig(input=version_folder, input_format="dataset", output=str(tmp_path))
    result = score_images(spark, config, model)
    assert (result.scored, result.quarantined) == (1797, 0)
    predicted = pq.read_table(result.predictions_url).column("source").to_pylist()
    splits = [pq.read_table(Path(digits_dataset.path) / s, columns=["source"]) for s in SPLITS]
    assert sorted(predicted) == sorted(sum((t.column("source").to_pylist() for t in splits), []))

    # A split folder in the bucket: its row groups read by the executors through s3fs.
    split = Path(digits_dataset.path) / "val"
    prefix = f"s3://hvdflow-tests/{tmp_path.name}/val/"
    for path in split.iterdir():
        store.upload_file(str(path), prefix + path.name)
    config = ScoreConfig(input=prefix, input_format="dataset", output=str(tmp_path / "from-s3"))
    from_bucket = score_images(spark, config, model)
    assert from_bucket.scored == digits_dataset.val_rows
    read = pq.read_table(from_bucket.predictions_url).sort_by("source")
    assert read.column("source").to_pylist() == sorted(splits[1].column("source").to_pylist())


def test_a_missing_alias_or_version_names_what_the_model_has(mlflow_server, digits_model):
    name, version = digits_model
    uri = mlflow_server.tracking_uri
    with pytest.raises(ValueError) as error:
        fetch_model(ModelRef(name=name, alias="production"), uri)
    assert str(error.value) == (
        f"model {name!r} has no alias 'production'; its aliases: champion (version {version}): "
        "pass one of them as alias, or a version number"
    )
    with pytest.raises(ValueError, match=f"model {name!r} has no version 99; its versions: "):
        fetch_model(ModelRef(name=name, version="99"), uri)
    with pytest.raises(ValueError, match="registered model 'no-such-model' does not exist"):
        fetch_model(ModelRef(name="no-such-model"), uri)


def test_a_model_that_does_not_fit_fails_before_any_spark_work(
    spark, mlflow_server, digits_dataset, tmp_path, monkeypatch
):
    monkeypatch.setenv("HVDFLOW_CACHE_DIR", str(tmp_path / "cache"))
    uri = mlflow_server.tracking_uri
    name = f"tests-score-cnn-{uuid.uuid4().hex[:6]}"
    register_model(uri, name, model="mnist_cnn", input_shape=(28, 28, 1))
    model = fetch_model(ModelRef(name=name), uri)
    jobs = spark_jobs_so_far(spark)
    config = ScoreConfig(
        input=str(Path(digits_dataset.path).parent),
        input_format="dataset",
        output=str(tmp_path / "output"),
    )
    with pytest.raises(ValueError) as error:
        score_images(spark, config, model)
    assert str(error.value).startswith(
        f"the dataset holds images of shape (8, 8) but model {model.uri} takes (28, 28, 1)"
    )
    assert spark_jobs_so_far(spark) == jobs
    assert not (tmp_path / "output").exists()  # nothing written

    # A label map of 3 classes for a model with 10 outputs: refused when the model is found.
    mismatched = f"tests-score-labels-{uuid.uuid4().hex[:6]}"
    register_model(uri, mismatched, labels=["cat", "dog", "emu"], num_classes=10, legacy=True)
    with pytest.raises(ValueError, match="outputs 10 class probabilities but the label map"):
        fetch_model(ModelRef(name=mismatched), uri)
