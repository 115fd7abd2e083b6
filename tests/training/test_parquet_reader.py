"""The pyarrow reader (``training.parquet_reader``): the same rows as Petastorm's, from the JSON
description alone, and clear errors when that description is missing or bad."""

from __future__ import annotations

import json
import shutil
import warnings
from pathlib import Path

import numpy as np
import pytest

from hvdflow.training import parquet_reader
from hvdflow.training.interval_eval import subset_rows
from hvdflow.training.parquet_reader import SCHEMA_FILE, FieldDescription, load_rows, shard_pieces
from hvdflow.training.reader import load_shard, open_dataset

FIELDS = ("image", "label", "source")


def local(url: str) -> Path:
    return Path(url.removeprefix("file://"))


def copy_split(url: str, to: Path) -> Path:
    """A copy of a split folder (the session's dataset is shared: never change it)."""
    return Path(shutil.copytree(local(url), to / "split"))


# --- the stream's batches and raw pixels ------------------------------------------------------


@pytest.mark.unit
def test_a_stream_gives_every_row_once_in_batches_shuffled_across_row_groups(monkeypatch):
    def row_groups(url, seed, shuffle, **rows):  # five row groups of 300 rows, labels = 2 x row
        for group in range(5):
            ids = np.arange(group * 300, (group + 1) * 300)
            yield ids, ids * 2

    monkeypatch.setattr(parquet_reader, "iter_row_groups", row_groups)
    ordered = list(parquet_reader.iter_batches("x", batch_size=128, shuffle=False))
    assert [len(ids) for ids, _ in ordered] == [128] * 11 + [92]
    assert np.concatenate([ids for ids, _ in ordered]).tolist() == list(range(1500))
    shuffled = list(parquet_reader.iter_batches("x", batch_size=128, seed=3))
    ids = np.concatenate([ids for ids, _ in shuffled])
    assert sorted(ids.tolist()) == list(range(1500))
    assert (np.concatenate([labels for _, labels in shuffled]) == ids * 2).all()
    # The first window is 1,200 rows (4 row groups, SHUFFLE_ROWS 1,024): its batches mix them.
    assert len({int(i) // 300 for i in shuffled[0][0]}) == 4
    again = list(parquet_reader.iter_batches("x", batch_size=128, seed=3))
    assert all((a[0] == b[0]).all() for a, b in zip(shuffled, again, strict=True))


@pytest.mark.unit
def test_a_shuffled_stream_gives_batches_as_row_groups_come_not_in_bursts(monkeypatch):
    read = []

    def row_groups(url, seed, shuffle, **rows):  # 40 row groups of 64 rows, counted as read
        for group in range(40):
            read.append(group)
            yield (np.arange(group * 64, (group + 1) * 64),)

    monkeypatch.setattr(parquet_reader, "iter_row_groups", row_groups)
    when = [len(read) for _ in parquet_reader.iter_batches("x", batch_size=128, seed=1)]
    # The pool fills to SHUFFLE_ROWS (16 row groups) once; then a batch every 2 row groups, as
    # many rows as come in, where windows of 1,024 rows came 8 batches at a time.
    assert when[0] == 16 and all(b - a <= 2 for a, b in zip(when, when[1:-8], strict=False))
    assert len(when) == 40 * 64 // 128


@pytest.mark.unit
def test_raw_pixels_are_viewed_in_place_and_a_damaged_value_is_named():
    import pyarrow as pa

    field = FieldDescription("image", "uint8", (2, 3), "raw")
    values = [bytes(range(6 * i, 6 * i + 6)) for i in range(4)]
    chunk = pa.array(values, pa.binary())
    pixels = parquet_reader._raw_pixels(field, pa.chunked_array([chunk]))
    assert pixels.shape == (4, 2, 3) and pixels[3].tolist() == [[18, 19, 20], [21, 22, 23]]
    assert np.shares_memory(pixels, np.frombuffer(chunk.buffers()[2], dtype=np.uint8))
    assert parquet_reader._raw_pixels(field, chunk.slice(1, 2))[0, 0].tolist() == [6, 7, 8]
    two = pa.chunked_array([chunk.slice(0, 2), chunk.slice(2)])
    assert parquet_reader._raw_pixels(field, two).tolist() == pixels.tolist()
    with pytest.raises(ValueError, match=r"\(6 bytes\), but a value has 3 bytes: the split is "):
        parquet_reader._raw_pixels(field, pa.array([values[0], b"abc"], pa.binary()))


# --- which row groups a rank reads ---------------------------------------------------------


@pytest.mark.unit
@pytest.mark.parametrize("seed", [None, 0, 7])
@pytest.mark.parametrize("size", [1, 2, 3, 5])
def test_shards_are_petastorms_own(size, seed):
    """Petastorm's own sharding function, given the row groups in its order (files sorted by
    path, each file's row groups in order), picks the same row groups in the same order."""
    petastorm_reader = pytest.importorskip("petastorm.reader")
    row_groups = {"part-00002.parquet": 1, "part-00000.parquet": 3, "part-00001.parquet": 2}
    ordered = [("part-00000.parquet", i) for i in range(3)]
    ordered += [("part-00001.parquet", i) for i in range(2)] + [("part-00002.parquet", 0)]
    for rank in range(size):
        theirs = petastorm_reader.Reader._partition_row_groups(
            None, None, ordered, size, rank, list(range(len(ordered))), seed
        )
        assert shard_pieces(row_groups, rank, size, seed) == [ordered[i] for i in theirs]


@pytest.mark.unit
def test_shards_by_row_group_number():
    row_groups = {"part-00001.parquet": 2, "part-00000.parquet": 3}
    assert shard_pieces(row_groups, 0, 2) == [
        ("part-00000.parquet", 0),
        ("part-00000.parquet", 2),
        ("part-00001.parquet", 1),
    ]
    assert shard_pieces(row_groups, 1, 2) == [("part-00000.parquet", 1), ("part-00001.parquet", 0)]
    # A seed reorders a shard; it never moves a row group to another rank.
    assert sorted(shard_pieces(row_groups, 0, 2, seed=3)) == shard_pieces(row_groups, 0, 2)


@pytest.mark.unit
def test_more_ranks_than_row_groups_is_refused():
    with pytest.raises(ValueError, match=r"2 row groups, fewer than size=3: .*fewer ranks"):
        shard_pieces({"part-00000.parquet": 2}, 0, 3)
    with pytest.raises(ValueError, match=r"rank=2 is not in \[0, size=2\)"):
        shard_pieces({"part-00000.parquet": 2}, 2, 2)


# --- a missing or bad description --------------------------------------------------------


def split_with(tmp_path: Path, description: bytes | None) -> Path:
    """A split folder with one small Parquet file and ``description`` as its JSON (if any)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    split = tmp_path / "train"
    split.mkdir()
    table = pa.table({"label": pa.array([1, 2], pa.int32())})
    pq.write_table(table, split / "part-00000.parquet")
    if description is not None:
        (split / SCHEMA_FILE).write_bytes(description)
    return split


@pytest.mark.unit
def test_a_missing_description_names_the_file_and_the_fix(tmp_path):
    split = split_with(tmp_path, None)
    with pytest.raises(RuntimeError) as raised:
        load_shard(str(split), fields=("label",), reader="pyarrow")
    message = str(raised.value)
    assert f"{split}/{SCHEMA_FILE} does not exist" in message
    assert "re-run preprocessing" in message


@pytest.mark.unit
@pytest.mark.parametrize(
    "content, problem",
    [
        (b"{not json", "not valid JSON"),
        (b'{"fields": []}', 'no "format": "hvdflow-split"'),
        (b'{"format": "hvdflow-split", "version": 2}', "format version 2, this hvdflow reads"),
        (b'{"format": "hvdflow-split", "version": 1, "fields": [{"name": "label"}]}', "malformed"),
        (
            b'{"format": "hvdflow-split", "version": 1, "row_groups": {"part-00000.parquet": 1},'
            b' "fields": [{"name": "label", "dtype": "int32", "shape": [], "codec": "webp"}]}',
            "codec 'webp'",
        ),
    ],
)
def test_a_bad_description_names_the_file_and_the_fix(tmp_path, content, problem):
    split = split_with(tmp_path, content)
    with pytest.raises(RuntimeError) as raised:
        load_shard(f"file://{split}", fields=("label",), reader="pyarrow")
    message = str(raised.value)
    assert message.startswith(f"file://{split}/{SCHEMA_FILE}: ")
    assert problem in message
    assert "re-run preprocessing" in message


@pytest.mark.unit
def test_a_description_that_disagrees_with_the_files_is_refused(tmp_path):
    description = {
        "format": "hvdflow-split",
        "version": 1,
        "fields": [{"name": "label", "dtype": "int32", "shape": [], "codec": "scalar"}],
        "row_groups": {"part-00000.parquet": 3},
    }
    split = split_with(tmp_path, json.dumps(description).encode())
    with pytest.raises(RuntimeError, match=r"has 1 row groups, _hvdflow_schema.json says 3"):
        load_shard(str(split), fields=("label",), reader="pyarrow")
    with pytest.raises(ValueError, match=r"field 'image' is not in this split \(it has label\)"):
        load_shard(str(split), fields=("image",), reader="pyarrow")


@pytest.mark.unit
@pytest.mark.parametrize("side, image", [(2, b"not a png"), (2, "4x4"), (4, "4x4")])
def test_an_image_unlike_its_description_is_refused_naming_the_file(tmp_path, side, image):
    """Corrupt bytes, or a PNG larger than the field's shape (refused before it is decoded: a
    decompression bomb in a writable prefix costs a rank nothing), name the file; a PNG of the
    described size reads."""
    import io

    import pyarrow as pa
    import pyarrow.parquet as pq
    from PIL import Image

    if image == "4x4":
        buffer = io.BytesIO()
        Image.fromarray(np.full((4, 4), 7, np.uint8), "L").save(buffer, "PNG")
        image = buffer.getvalue()
    split = tmp_path / "train"
    split.mkdir()
    pq.write_table(pa.table({"image": [image]}), split / "part-00000.parquet")
    description = {
        "format": "hvdflow-split",
        "version": 1,
        "fields": [{"name": "image", "dtype": "uint8", "shape": [side, side], "codec": "png"}],
        "row_groups": {"part-00000.parquet": 1},
    }
    (split / SCHEMA_FILE).write_text(json.dumps(description))
    if side == 4:
        (images,) = load_shard(str(split), fields=("image",), reader="pyarrow")
        assert images.shape == (1, 4, 4) and (images == 7).all()
    else:
        with pytest.raises(RuntimeError) as raised:
            load_shard(str(split), fields=("image",), reader="pyarrow")
        message = str(raised.value)
        assert message.startswith(f"{split}/part-00000.parquet, row group 0: an image is not")
        assert "re-run preprocessing" in message


@pytest.mark.unit
@pytest.mark.parametrize("shape", [(5, 7), (5, 7, 3)])
def test_opencv_and_pillow_decode_a_stored_image_to_the_same_pixels(monkeypatch, shape):
    """Stored PNGs of the field's shape take OpenCV's fast path (as Petastorm's codec does),
    others and machines without OpenCV take Pillow's: the pixels are the same either way,
    RGB in RGB order."""
    import io

    import pyarrow as pa
    from PIL import Image

    from hvdflow.training import parquet_reader

    pixels = np.random.default_rng(0).integers(0, 256, shape, dtype=np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels, "L" if len(shape) == 2 else "RGB").save(buffer, "PNG")
    field = parquet_reader.FieldDescription("image", "uint8", shape, "png")
    column = pa.chunked_array([[buffer.getvalue()]])
    assert parquet_reader._png_size(buffer.getvalue()) == shape[:2]
    fast = parquet_reader._decoded(field, column)
    monkeypatch.setattr(parquet_reader, "_opencv", lambda: None)
    assert (parquet_reader._decoded(field, column) == fast).all()
    assert (fast[0] == pixels).all()


@pytest.mark.unit
def test_an_unknown_reader_is_refused():
    with pytest.raises(ValueError, match=r"reader='arrow': expected one of petastorm, pyarrow"):
        load_shard("/nowhere", reader="arrow")


# --- on a dataset the preprocessing step made ---------------------------------------------


@pytest.mark.integration
def test_every_shard_is_petastorms_row_for_row(digits_dataset):
    """Shards of 1, 2 and 3 ranks: the same images, labels and sources, in the same order."""
    url = digits_dataset.train_url
    for size in (1, 2, 3):
        seen = []
        for rank in range(size):
            theirs = load_shard(url, rank=rank, size=size, fields=FIELDS)
            ours = load_shard(url, rank=rank, size=size, fields=FIELDS, reader="pyarrow")
            for field, a, b in zip(FIELDS, theirs, ours, strict=True):
                assert b.dtype == a.dtype and b.shape == a.shape, (size, rank, field)
                np.testing.assert_array_equal(b, a, err_msg=f"size={size} rank={rank} {field}")
            seen += list(ours[2])
        assert sorted(seen) == sorted(load_shard(url, fields=("source",))[0])
    images, labels, _ = load_shard(url, fields=FIELDS, reader="pyarrow")
    assert images.shape == (digits_dataset.train_rows, 8, 8) and images.dtype == np.uint8
    assert labels.dtype == np.int32 and set(labels) == set(range(10))


@pytest.mark.integration
def test_a_ranks_part_of_an_evaluation_subset_is_those_rows_of_the_whole_split(digits_dataset):
    """What each rank evaluates: its every-n-th of the subset, read without the whole split."""
    url, rows = digits_dataset.val_url, digits_dataset.val_rows
    whole = load_shard(url, fields=FIELDS, reader="pyarrow")
    subset = subset_rows(rows, 100, seed=3)
    for rank in (0, 1):
        part = load_rows(url, subset[rank::2], fields=FIELDS)
        for field, ours, all_rows in zip(FIELDS, part, whole, strict=True):
            np.testing.assert_array_equal(ours, all_rows[subset[rank::2]], err_msg=field)
    empty = load_rows(url, [])
    assert empty[0].shape == (0, 8, 8) and len(empty[1]) == 0


@pytest.mark.integration
def test_open_dataset_gives_what_petastorm_gives(digits_dataset):
    """The tf.data rows a rank trains on, streamed and in memory: same values, same specs."""
    url = digits_dataset.val_url

    def rows(reader, **options):
        with open_dataset(
            url, batch_size=None, num_epochs=1, shuffle=False, reader=reader, **options
        ) as ds:
            spec = ds.element_spec
            pairs = [(image.numpy(), label.numpy()) for image, label in ds]
        return spec, np.stack([p[0] for p in pairs]), np.array([p[1] for p in pairs])

    for options in ({"rank": 1, "size": 2}, {"in_memory": True}):
        theirs, ours = rows("petastorm", **options), rows("pyarrow", **options)
        assert ours[0] == theirs[0]
        np.testing.assert_array_equal(ours[1], theirs[1])
        np.testing.assert_array_equal(ours[2], theirs[2])
    assert ours[1].dtype == np.float32 and 0 <= ours[1].min() and ours[1].max() <= 1

    with open_dataset(url, batch_size=32, num_epochs=2, seed=1, reader="pyarrow") as ds:
        batches = [(images.shape, labels.dtype) for images, labels in ds]
    assert sum(shape[0] for shape, _ in batches) == 2 * digits_dataset.val_rows
    assert batches[0] == ((32, 8, 8, 1), np.int32)


@pytest.mark.integration
def test_reads_without_the_pickle_that_petastorm_needs(digits_dataset, tmp_path):
    """With ``_common_metadata`` gone (nothing to unpickle), the pyarrow reader reads the split
    as before; Petastorm's reader no longer knows the images are PNG and gives their bytes."""
    url = digits_dataset.train_url
    split = copy_split(url, tmp_path)
    (split / "_common_metadata").unlink()

    ours = load_shard(str(split), rank=1, size=2, reader="pyarrow")
    before = load_shard(url, rank=1, size=2)
    for a, b in zip(before, ours, strict=True):
        np.testing.assert_array_equal(b, a)

    with pytest.warns(UserWarning, match="reading only Petastorm datasets"):
        warnings.simplefilter("ignore", FutureWarning)  # pyarrow 14's, about Petastorm's calls
        images, _ = load_shard(split.as_uri(), rank=1, size=2)
    assert images.dtype.kind == "S" and images.shape == (len(before[0]),)  # PNG bytes, no pixels


@pytest.mark.integration
def test_reads_a_split_that_preprocessing_wrote_to_a_bucket(spark, store, tmp_path):
    """Preprocessing writes the description to s3:// too, and the reader reads it from there
    (the endpoint of the AWS variables): Petastorm's rows, row for row."""
    from hvdflow.tasks.preprocess import PreprocessConfig, preprocess_images

    output = store.config.uri(store.config.key("datasets"))
    config = PreprocessConfig(
        input=str(tmp_path / "images"), input_format="digits", output=output, image_size=(8, 8)
    )
    url = preprocess_images(spark, config, store=store).val_url
    assert url.startswith("s3://")
    for rank in range(2):
        theirs = load_shard(url, rank=rank, size=2, fields=FIELDS)
        ours = load_shard(url, rank=rank, size=2, fields=FIELDS, reader="pyarrow")
        for a, b in zip(theirs, ours, strict=True):
            np.testing.assert_array_equal(b, a)
    with pytest.raises(RuntimeError, match=rf"{url}-gone/{SCHEMA_FILE} does not exist"):
        load_shard(f"{url}-gone", reader="pyarrow")


@pytest.mark.integration
def test_the_pipelines_training_reads_with_either_reader_to_the_same_model(
    digits_dataset, tmp_path
):
    """training.reader reaches the ranks: two ranks train the digits MLP with Petastorm's
    reader, and with pyarrow's on a copy of the dataset without ``_common_metadata`` (which
    Petastorm cannot train on), and end at the same accuracy: the same rows, the same order."""
    import dataclasses

    from hvdflow import HorovodRunner, LaunchOptions
    from hvdflow.tasks.config import TrainingParams
    from hvdflow.tasks.train.spec import training_spec
    from hvdflow.training.trainer import train_classifier

    without_pickle = {}
    for name in ("train_url", "val_url"):
        split = Path(shutil.copytree(local(getattr(digits_dataset, name)), tmp_path / name))
        (split / "_common_metadata").unlink()
        without_pickle[name] = str(split)
    datasets = {
        "petastorm": digits_dataset,
        "pyarrow": dataclasses.replace(digits_dataset, **without_pickle),
    }
    ended = {}
    for reader, dataset in datasets.items():
        params = TrainingParams(model="digits_mlp", epochs=3, reader=reader)
        spec = training_spec(params, dataset).replace(threads=1)
        lines = []
        runner = HorovodRunner(np=-2, options=LaunchOptions(on_log_line=lines.append))
        result = runner.run(train_classifier, spec=spec)
        ended[reader] = result.history["val_accuracy"][-1]
        said = [line.text for line in lines if line.text.startswith("data: ")]
        assert said and said[0].endswith(f"read by {reader}"), said
    assert ended["petastorm"] > 0.8
    assert abs(ended["pyarrow"] - ended["petastorm"]) <= 0.01, ended
