"""Scoring's decisions as plain values: model checks, listings, the output's layout."""

from __future__ import annotations

import io
import json
import subprocess
import sys
import time

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from PIL import Image

from hvdflow.infra.storage import attempts
from hvdflow.serving.images import model_input
from hvdflow.tasks.score.config import ModelRef, ScoreConfig
from hvdflow.tasks.score.inputs import WHOLE_FILE, Unit, list_dataset, list_images
from hvdflow.tasks.score.job import partitions_for
from hvdflow.tasks.score.model import ScoringModel, check_labels, image_settings, labels_in_order
from hvdflow.tasks.score.record import metric_name

pytestmark = pytest.mark.unit


def model(input_shape=(8, 8, 1), outputs=3, labels=("ant", "bee", "cat")) -> ScoringModel:
    return ScoringModel(
        name="m",
        version="4",
        run_id="r",
        model_uuid="u",
        input_shape=input_shape,
        num_outputs=outputs,
        labels=labels,
        local_dir="/nowhere",
    )


def test_a_model_ref_names_one_version_by_alias_or_number():
    assert ModelRef(name="m").uri == "models:/m@champion"
    assert ModelRef(name="m", alias="candidate").uri == "models:/m@candidate"
    assert ModelRef(name="m", version="3").uri == "models:/m/3"
    with pytest.raises(ValueError, match="alias 'candidate' and version '3' both given"):
        ModelRef(name="m", alias="candidate", version="3")
    with pytest.raises(ValueError, match="version 'latest' is not a version number"):
        ModelRef(name="m", version="latest")


def test_images_are_decoded_to_the_models_input_size_and_colours():
    assert image_settings(model()) == ((8, 8), "L")
    assert image_settings(model((224, 224, 3))) == ((224, 224), "RGB")
    assert image_settings(model((None, None, 3)), image_size=(32, 48)) == ((32, 48), "RGB")
    # A dataset's stored shape is checked; (8, 8) is grayscale.
    assert image_settings(model(), stored_shape=(8, 8)) == ((8, 8), "L")


@pytest.mark.parametrize(
    ("shape", "kwargs", "message"),
    [
        (
            (8, 8, 1),
            {"stored_shape": (28, 28)},
            "the dataset holds images of shape (28, 28) but model models:/m/4 takes (8, 8, 1) "
            "(height, width, channels): score the raw images instead (input_format 'images' "
            "resizes them), or a dataset preprocessed for this model",
        ),
        (
            (8, 8, 1),
            {"stored_shape": (8, 8, 3)},
            "the dataset holds images of shape (8, 8, 3) but model models:/m/4 takes (8, 8, 1)",
        ),
        (
            (8, 8, 1),
            {"image_size": (28, 28)},
            "image_size (28, 28) does not fit model models:/m/4, which takes 8x8 images: use "
            "image_size [8, 8] or leave it unset",
        ),
        (
            (8, 8, 1),
            {"color_mode": "RGB"},
            "color_mode 'RGB' does not fit model models:/m/4, which takes 1-channel images "
            "('L'): use color_mode 'L'",
        ),
        ((64,), {}, "model models:/m/4 takes inputs of shape (64,): expected images"),
        ((None, None, 1), {}, "accepts images of any size (None, None, 1): give image_size"),
    ],
)
def test_a_model_that_does_not_fit_the_data_is_refused_naming_both(shape, kwargs, message):
    with pytest.raises(ValueError) as error:
        image_settings(model(shape), **kwargs)
    assert message in str(error.value)


def test_the_label_map_must_match_the_models_outputs():
    check_labels(model())
    with pytest.raises(ValueError) as error:
        check_labels(model(outputs=10))
    assert str(error.value).startswith(
        "model models:/m/4 outputs 10 class probabilities but the label map of its training "
        "run has 3 classes (ant, bee, cat)"
    )
    assert labels_in_order({"cat": 2, "ant": 0, "bee": 1}, "x") == ["ant", "bee", "cat"]
    with pytest.raises(ValueError, match=r"label indices \[0, 2\] are not 0..1"):
        labels_in_order({"ant": 0, "cat": 2}, "x")


def test_images_are_listed_at_any_depth_without_dot_files(tmp_path):
    for name in ("top.png", "a/one.png", "a/deep/two.jpg", "b/three.png", ".hidden.png"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_bytes(b"x")
    (tmp_path / ".cache").mkdir()
    (tmp_path / ".cache" / "x.png").write_bytes(b"x")
    listing = list_images(str(tmp_path))
    assert [u.source for u in listing.units] == [
        "a/deep/two.jpg",
        "a/one.png",
        "b/three.png",
        "top.png",
    ]
    assert all(u.row_group == WHOLE_FILE and u.rows == 1 for u in listing.units)
    assert listing.units[-1].path == str(tmp_path / "top.png")
    assert listing.stored_shape is None


def write_split(folder, rows_per_group: list[int], shape=(8, 8)) -> None:
    folder.mkdir(parents=True)
    buffer = io.BytesIO()
    Image.fromarray(np.zeros(shape, np.uint8)).save(buffer, "PNG")
    n = sum(rows_per_group)
    table = pa.table(
        {
            "image": [buffer.getvalue()] * n,
            "label": [0] * n,
            "source": [f"s{i}" for i in range(n)],
        }
    )
    with pq.ParquetWriter(folder / "part-00000.parquet", table.schema) as writer:
        start = 0
        for rows in rows_per_group:
            writer.write_table(table.slice(start, rows))
            start += rows
    pq.write_metadata(table.schema, folder / "_common_metadata")


def test_a_dataset_is_listed_by_row_group_with_its_image_shape(tmp_path):
    write_split(tmp_path / "val", [3, 2], shape=(6, 5))
    listing = list_dataset(str(tmp_path / "val"))
    path = str(tmp_path / "val" / "part-00000.parquet")
    assert listing.units == [Unit(path, path, 0, 3), Unit(path, path, 1, 2)]
    assert listing.rows == 5 and listing.stored_shape == (6, 5)

    # A dataset version folder: its manifest names the attempt and the shape; both splits.
    attempt = tmp_path / "version" / "attempt-1"
    write_split(attempt / "train", [4])
    write_split(attempt / "val", [1])
    manifest = {"path": str(attempt), "image_shape": [8, 8]}
    (tmp_path / "version" / "manifest.json").write_text(json.dumps(manifest))
    listing = list_dataset(str(tmp_path / "version"))
    assert [(u.path.rsplit("/", 2)[-2], u.rows) for u in listing.units] == [
        ("train", 4),
        ("val", 1),
    ]
    assert listing.stored_shape == (8, 8)


def test_a_folder_without_parquet_or_image_columns_is_refused(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="no Parquet files in"):
        list_dataset(str(tmp_path / "empty"))
    (tmp_path / "other").mkdir()
    pq.write_table(pa.table({"x": [1]}), tmp_path / "other" / "a.parquet")
    with pytest.raises(ValueError, match=r"has columns \['x'\]: input_format 'dataset' needs"):
        list_dataset(str(tmp_path / "other"))


def test_images_become_model_input_as_training_reads_them():
    gray = [np.full((2, 3), 255, np.uint8), np.zeros((2, 3), np.uint8)]
    batch = model_input(gray)
    assert batch.shape == (2, 2, 3, 1) and batch.dtype == np.float32
    assert batch.max() == 1.0 and batch.min() == 0.0
    assert model_input([np.zeros((2, 3, 3), np.uint8)]).shape == (1, 2, 3, 3)


def test_tasks_are_one_wave_of_slots_unless_that_is_too_many_images_each():
    assert partitions_for(images=60, units=60, slots=2) == 2
    assert partitions_for(images=3, units=1, slots=2) == 1  # one row group: one task
    assert partitions_for(images=100_000, units=100_000, slots=2) == 6  # 20,000 at most


def test_publishing_removes_the_replaced_attempt_and_stale_ones_only():
    now = time.time()
    mine, previous = attempts.new_attempt(now), attempts.new_attempt(now - 3600)
    running = attempts.new_attempt(now - 60)  # another run, still writing
    stale = attempts.new_attempt(now - attempts.STALE_ATTEMPT_S - 60)
    names = [mine, previous, running, stale, "not-an-attempt"]
    assert attempts.removable_attempts(names, mine, previous, now) == [previous, stale]
    assert abs(attempts.attempt_time(mine) - now) < 1.5
    assert attempts.attempt_time("attempt-garbage-1") is None


def test_class_names_become_valid_metric_names():
    assert metric_name("golden retriever") == "count/golden retriever"
    assert metric_name("a:b*c") == "count/a_b_c"


def test_the_input_must_exist_and_the_output_be_a_path_or_bucket(tmp_path):
    with pytest.raises(ValueError, match="is not an existing folder"):
        ScoreConfig(input=str(tmp_path / "missing"))
    with pytest.raises(ValueError, match="expected a local path or s3://bucket/prefix"):
        ScoreConfig(input=str(tmp_path), output="gs://bucket/x")
    assert ScoreConfig(input="s3://bucket/raw/").input_format == "images"


def test_the_parameters_load_no_engine():
    """The flows check a run's parameters before any service starts: the scoring and data
    parameters import no Spark, Petastorm, TensorFlow, MLflow, Prefect or boto3."""
    engines = ("pyspark", "petastorm", "tensorflow", "mlflow", "prefect", "boto3")
    probe = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys, hvdflow.tasks.config, hvdflow.tasks.score.config\n"
            f"print(sorted(m for m in sys.modules if m.split('.')[0] in {engines!r}))",
        ],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    assert probe.stdout.strip() == "[]"
