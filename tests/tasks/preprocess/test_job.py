"""Preprocessing on generated files in each input format, on the session's local[2] Spark,
from local folders and from a bucket of the session's SeaweedFS."""

from __future__ import annotations

import csv
import gzip
import io
import json
import os
import socket
import struct
import time
from collections import Counter
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from PIL import Image

from hvdflow.infra.storage.attempts import STALE_ATTEMPT_S, removable_attempts
from hvdflow.tasks.preprocess import PreprocessConfig, preprocess_images, sources
from hvdflow.tasks.preprocess import job as preprocess_job
from hvdflow.tasks.preprocess.config import DatasetManifest
from hvdflow.tasks.preprocess.plan import check_ranks, check_reused
from hvdflow.tasks.preprocess.split import (
    choose_boundaries,
    is_val,
    split_key,
    stratified_val_sources,
)
from hvdflow.tasks.preprocess.write import CRASH_AFTER_FIRST_FILE_ENV, plan_row_groups
from hvdflow.training.reader import open_dataset
from tests.helpers import worker_variable


def make_class_tree(root, per_class=10, classes=("cat", "dog", "emu"), size=(20, 16)):
    """Real images in every mode a user's folder may hold: RGB JPEG, L PNG, P GIF, RGBA PNG."""
    rng = np.random.default_rng(0)
    for c, name in enumerate(classes):
        folder = root / name
        folder.mkdir(parents=True)
        for i in range(per_class):
            pixels = rng.integers(0, 255, (size[1], size[0], 3), dtype=np.uint8)
            image = Image.fromarray(pixels, "RGB")
            kind = (c + i) % 4
            if kind == 0:
                image.save(folder / f"{i}.jpg", quality=90)
            elif kind == 1:
                image.convert("L").save(folder / f"{i}.png")
            elif kind == 2:
                image.convert("P").save(folder / f"{i}.gif")
            else:
                image.convert("RGBA").save(folder / f"{i}.png")
    return root


def add_bad_files(root, big_side=300):
    """One of every kind of bad input, each in a class folder like a real stray file."""
    (root / "cat" / "empty.jpg").write_bytes(b"")
    good_jpeg = (root / "cat" / "0.jpg").read_bytes()
    (root / "cat" / "truncated.jpg").write_bytes(good_jpeg[: len(good_jpeg) // 2])
    (root / "dog" / "notes.txt").write_text("not an image")
    Image.fromarray(np.ones((8, 8), np.float32), "F").save(root / "dog" / "float.tif")
    Image.new("RGB", (big_side, big_side)).save(root / "emu" / "bomb.png")
    return {
        "cat/empty.jpg": "empty file (0 bytes)",
        "cat/truncated.jpg": "corrupt or truncated image",
        "dog/notes.txt": "a text file, not an image",
        "dog/float.tif": "unsupported image mode 'F'",
        "emu/bomb.png": f"{big_side}x{big_side} = {big_side * big_side} pixels is above max_pixels",
    }


def read_rows(url, columns=("label", "source", "split")):
    return pq.read_table(url.replace("file://", ""), columns=list(columns)).to_pylist()


def stored_rows(url, rank=0, size=1, fields=("image", "source")):
    """Petastorm's reader over this rank's rows, once, in order, as stored (local or s3://)."""
    return open_dataset(
        url,
        rank=rank,
        size=size,
        batch_size=None,
        num_epochs=1,
        shuffle=False,
        fields=fields,
        normalize=False,
    )


def read_sources(url, rank=0, size=1):
    """The `source` of every row Petastorm's reader gives this rank (local or s3://)."""
    with stored_rows(url, rank, size) as ds:
        return [row.source.numpy().decode() for row in ds]


def good_sources(root, bad):
    """Every file under `root` (class/name) that is not one of the `bad` ones."""
    found = {str(p.relative_to(root)) for p in Path(root).rglob("*") if p.is_file()}
    return sorted(found - set(bad))


def val_picks(root, bad, fraction, seed):
    """The validation picks of the listed files, and those that are usable (sorted)."""
    files = [p.relative_to(root) for p in Path(root).rglob("*") if p.is_file()]
    chosen = stratified_val_sources([(str(f), f.parts[0]) for f in files], fraction, seed)
    return chosen, sorted(chosen - set(bad))


def upload_tree(store, root, prefix):
    """The files under `root` as objects under `prefix`; returns the s3:// URI of the prefix."""
    for path in sorted(Path(root).rglob("*")):
        if path.is_file():
            key = store.config.key(prefix, str(path.relative_to(root)))
            store.upload_file(str(path), store.config.uri(key))
    return store.config.uri(store.config.key(prefix)) + "/"


@pytest.mark.integration
def test_class_folders_with_bad_files_are_quarantined_not_fatal(spark, tmp_path):
    root = make_class_tree(tmp_path / "images")
    expected_bad = add_bad_files(root)
    config = PreprocessConfig(
        input=str(root),
        input_format="folders",
        output=str(tmp_path / "out"),
        image_size=(12, 10),
        color_mode="RGB",
        val_fraction=0.2,
        max_pixels=200 * 200,
        max_bad_fraction=0.2,
        np=2,  # 6 val rows: fewer than the default 8 row groups
    )
    manifest = preprocess_images(spark, config)

    chosen, expected_val = val_picks(root, expected_bad, 0.2, seed=0)
    # Stratified over the listing: each class (12, 12 and 11 files) has 2 validation picks; a
    # pick that is unusable is quarantined, not replaced.
    assert Counter(source.split("/")[0] for source in chosen) == {"cat": 2, "dog": 2, "emu": 2}
    assert (manifest.train_rows, manifest.val_rows, manifest.quarantined) == (
        30 - len(expected_val),
        len(expected_val),
        5,
    )
    assert manifest.label_map == {"cat": 0, "dog": 1, "emu": 2}
    assert manifest.image_shape == (12, 10, 3)
    train, val = read_rows(manifest.train_url), read_rows(manifest.val_url)
    assert sorted(r["source"] for r in val) == expected_val
    assert len(train) == manifest.train_rows
    assert {r["split"] for r in train} == {"train"} and {r["split"] for r in val} == {"val"}
    assert not {r["source"] for r in train} & {r["source"] for r in val}
    # The Petastorm schema is stored with the dataset, and the images decode to the shape.
    with open_dataset(manifest.train_url, batch_size=None, num_epochs=1, shuffle=False) as ds:
        image, label = next(iter(ds))
        streamed_autotuning = ds.options().autotune.enabled
    assert image.shape == (12, 10, 3) and 0.0 <= float(image.numpy().min()) <= 1.0
    with open_dataset(manifest.train_url, batch_size=4, in_memory=True) as ds:
        in_memory_image = next(iter(ds))[0][0]
        in_memory_autotuning = ds.options().autotune.enabled
    assert in_memory_image.shape == (12, 10, 3)
    # Read either way without tf.data's autotuning thread, whose wake-up the deletion of the
    # iterator awaited for up to a minute at the end of model.fit (training/reader.py).
    assert (streamed_autotuning, in_memory_autotuning) == (False, False)

    with open(manifest.quarantine_path) as f:
        report = {row["source"]: row["reason"] for row in csv.DictReader(f)}
    assert set(report) == set(expected_bad)
    for source, reason in expected_bad.items():
        assert report[source].startswith(reason), (source, report[source])
    attempt = tmp_path / "out" / manifest.fingerprint[:16] / manifest.attempt
    assert manifest.path == str(attempt)
    assert json.loads((attempt / "labels.json").read_text()) == manifest.label_map
    assert manifest.quarantine_path == str(attempt / "quarantine.csv")
    # Petastorm's metadata names the row groups the executors wrote: at least `row_groups`.
    assert manifest.train_row_groups >= 2 and manifest.val_row_groups >= 2
    assert not (attempt / "quarantine").exists()  # the executors' parts, merged into one


@pytest.mark.integration
def test_same_fingerprint_reuses_and_a_changed_input_writes_a_new_version(spark, tmp_path):
    root = make_class_tree(tmp_path / "images", per_class=4)
    config = PreprocessConfig(
        input=str(root),
        input_format="folders",
        output=str(tmp_path / "out"),
        image_size=(8, 8),
        np=2,
    )
    first = preprocess_images(spark, config)
    manifest_file = tmp_path / "out" / first.fingerprint[:16] / "manifest.json"
    written_at = manifest_file.stat().st_mtime_ns

    again = preprocess_images(spark, config)
    assert again.reused and again.fingerprint == first.fingerprint
    assert manifest_file.stat().st_mtime_ns == written_at  # nothing rewritten

    Image.new("L", (8, 8), 200).save(root / "cat" / "new.png")
    changed = preprocess_images(spark, config)
    assert not changed.reused and changed.fingerprint != first.fingerprint
    assert changed.train_rows + changed.val_rows == 13

    resized = preprocess_images(spark, config.model_copy(update={"image_size": (6, 6)}))
    assert resized.fingerprint != changed.fingerprint  # parameters are part of it


@pytest.mark.integration
def test_too_many_bad_files_fail_with_the_fraction_and_leave_no_dataset(spark, tmp_path):
    root = make_class_tree(tmp_path / "images", per_class=2, classes=("a",))
    add_bad_files_root = root / "a"
    for i in range(3):
        (add_bad_files_root / f"junk{i}.jpg").write_bytes(b"")
    config = PreprocessConfig(
        input=str(root),
        input_format="folders",
        image_size=(28, 28),
        output=str(tmp_path / "out"),
        max_bad_fraction=0.5,
        np=1,
    )
    with pytest.raises(ValueError) as err:
        preprocess_images(spark, config)
    assert "3 of 5 inputs (60%) are unusable, above max_bad_fraction=0.5" in str(err.value)
    assert "raise max_bad_fraction" in str(err.value)
    leftovers = list((tmp_path / "out").iterdir()) if (tmp_path / "out").exists() else []
    assert leftovers == []  # nothing that looks like a finished (or unfinished) dataset


@pytest.mark.integration
def test_input_without_images_fails_clearly(spark, tmp_path):
    (tmp_path / "empty" / "cat").mkdir(parents=True)
    with pytest.raises(ValueError, match="no images found in .*expected one sub-folder per class"):
        preprocess_images(
            spark,
            PreprocessConfig(
                input=str(tmp_path / "empty"), input_format="folders", image_size=(28, 28)
            ),
        )
    # A folder that is not there fails when the config is built, before anything is listed.
    with pytest.raises(ValueError, match="is not an existing folder: give the folder of class"):
        PreprocessConfig(input=str(tmp_path / "missing"), input_format="folders")


def write_idx(path, array, gz):
    data = struct.pack(">BBBB", 0, 0, 0x08, array.ndim)
    data += struct.pack(f">{array.ndim}I", *array.shape) + array.astype(np.uint8).tobytes()
    if gz:
        with gzip.open(str(path) + ".gz", "wb") as f:
            f.write(data)
    else:
        path.write_bytes(data)


@pytest.mark.integration
@pytest.mark.parametrize("gz", [True, False])
def test_mnist_idx_files(spark, tmp_path, gz):
    rng = np.random.default_rng(1)
    images = rng.integers(0, 255, (30, 28, 28), dtype=np.uint8)
    labels = np.arange(30) % 10
    write_idx(tmp_path / "train-images-idx3-ubyte", images, gz)
    write_idx(tmp_path / "train-labels-idx1-ubyte", labels, gz)
    write_idx(tmp_path / "t10k-images-idx3-ubyte", images[:10], gz)
    write_idx(tmp_path / "t10k-labels-idx1-ubyte", labels[:10], gz)
    config = PreprocessConfig(
        input=str(tmp_path),
        image_size=(28, 28),
        input_format="mnist_idx",
        output=str(tmp_path / "out"),
        val_fraction=0.25,
    )
    manifest = preprocess_images(spark, config)
    assert manifest.train_rows + manifest.val_rows == 40
    assert manifest.val_rows == 10  # each digit has 4 images: one of each goes to validation
    assert manifest.label_map == {str(d): d for d in range(10)}
    rows = read_rows(manifest.train_url) + read_rows(manifest.val_url)
    by_source = {r["source"]: r["label"] for r in rows}
    name = "train-images-idx3-ubyte" + (".gz" if gz else "")
    assert by_source[f"{name}#13"] == 3
    # Pixels survive unchanged at the native size (PNG is lossless).
    with stored_rows(manifest.train_url) as ds:
        row = next(iter(ds))
    source = row.source.numpy().decode()
    index = int(source.split("#")[1])
    expected = (images if source.startswith("train") else images[:10])[index]
    assert np.array_equal(row.image.numpy(), expected)


@pytest.mark.unit
def test_the_two_pass_split_is_the_stratified_split():
    """Histogram, then boundary buckets: exactly the images the in-memory rule chooses."""
    rng = np.random.default_rng(7)
    for trial in range(40):
        classes = int(rng.integers(1, 6))
        fraction = float(rng.choice([0.0, 0.1, 0.2, 0.25, 0.5, 0.9]))
        count = int(rng.integers(0, 2000 if trial % 4 == 0 else 300))
        good = [(f"{trial}/{i}.png", str(rng.integers(0, classes))) for i in range(count)]
        rules = choose_boundaries(
            lambda good=good: ((int(label), source) for source, label in good),
            classes,
            fraction,
            seed=trial,
        )
        chosen = {s for s, label in good if is_val(rules, int(label), split_key(trial, s), s)}
        assert chosen == stratified_val_sources(good, fraction, trial), trial


@pytest.mark.unit
@pytest.mark.parametrize(
    ("counts", "groups"),
    [([10] * 8, 8), ([13, 0, 7, 1, 9], 8), ([100], 8), ([3, 3], 8), ([1] * 20, 8), ([50, 50], 3)],
)
def test_row_group_plan_gives_every_rank_a_non_empty_row_group(counts, groups):
    plan = plan_row_groups(counts, groups)
    assert [sum(sizes) for sizes in plan] == counts  # every row, once
    assert all(size > 0 for sizes in plan for size in sizes)
    assert sum(len(sizes) for sizes in plan) >= min(groups, sum(counts))
    # Even: within a file, row groups differ by at most one row.
    assert all(max(s) - min(s) <= 1 for s in plan if s)


@pytest.mark.unit
@pytest.mark.parametrize(("planned", "rows"), [([2, 2, 2, 2], 8), ([2, 2, 2, 2], 6), ([3, 3], 1)])
def test_unusable_inputs_never_cost_a_rank_its_row_group(tmp_path, planned, rows):
    """A file planned for the listed rows ends with min(planned groups, rows) row groups."""
    from hvdflow.tasks.preprocess.decode import Row
    from hvdflow.tasks.preprocess.write import _SplitFile

    url = str(tmp_path / "part-00000.parquet")
    split_file = _SplitFile(url, "train", planned, None, None)
    for i in range(rows):
        split_file.add(Row(f"c/{i}.png", 0, i, b"png"))
    split_file.close()
    metadata = pq.read_metadata(url)
    assert metadata.num_row_groups == split_file.groups == min(len(planned), rows)
    sizes = [metadata.row_group(i).num_rows for i in range(metadata.num_row_groups)]
    assert sum(sizes) == rows and min(sizes) >= 1
    assert pq.read_table(url).column("source").to_pylist() == [f"c/{i}.png" for i in range(rows)]


@pytest.mark.unit
def test_the_fingerprint_parameters_keep_their_names(tmp_path):
    """The split's seed is fingerprinted as ``seed`` and the row groups as ``files_per_split``
    (np <= 8 gives 8), the names they had, so the same settings fingerprint as before."""
    params = PreprocessConfig(
        input=str(tmp_path), input_format="folders", image_size=(28, 28)
    ).params()
    assert params == {
        "input_format": "folders",
        "image_size": (28, 28),
        "color_mode": "L",
        "val_fraction": 0.2,
        "seed": 0,
        "max_pixels": 50_000_000,
        "max_bad_fraction": 0.1,
        "files_per_split": 8,
    }
    assert PreprocessConfig(input="x", np=16).params()["files_per_split"] == 16
    assert PreprocessConfig(input="x", split_seed=3).params()["seed"] == 3


@pytest.mark.unit
def test_more_ranks_than_a_split_can_share_fails_before_any_spark_work(tmp_path):
    root = make_class_tree(tmp_path / "images", per_class=20)  # 48 train, 12 val rows
    config = PreprocessConfig(
        input=str(root),
        input_format="folders",
        image_size=(28, 28),
        output=str(tmp_path / "out"),
        np=16,
    )
    with pytest.raises(ValueError) as err:
        preprocess_images(None, config)  # no Spark session: it must not be needed
    message = str(err.value)
    assert "np=16" in message and "48 train and 12 val rows" in message
    assert "val has 12 < 16: use np <= 12, or add images, or raise val_fraction" in message
    assert not (tmp_path / "out").exists()

    with pytest.raises(ValueError, match=r"train has 48 < 50: use np <= 12, or add images$"):
        preprocess_images(None, config.model_copy(update={"np": 50}))


@pytest.mark.unit
def test_the_ranks_asked_for_decide_the_check_not_the_row_groups_they_are_cut_into(tmp_path):
    """np=2 on an input with 5 validation rows builds (its splits are cut into at most as many
    row groups as they have rows); the error names the np the user set, and the np that fits."""
    config = PreprocessConfig(input="x", np=2)
    assert config.row_groups == 8
    check_ranks(config, train=20, val=5)  # fewer rows than row groups, more than ranks: fine
    with pytest.raises(ValueError) as err:
        check_ranks(config.model_copy(update={"np": 6}), train=20, val=5)
    assert str(err.value) == (
        "np=6: each rank needs at least one row group of the val split, but 'x' lists 20 train "
        "and 5 val rows (val_fraction=0.2), so val has 5 < 6: use np <= 5, or add images, "
        "or raise val_fraction"
    )


@pytest.mark.unit
def test_a_reused_dataset_with_fewer_row_groups_than_ranks_is_refused_naming_both():
    manifest = DatasetManifest(
        path="/data/v/attempt-1",
        fingerprint="f",
        train_url="file:///data/v/attempt-1/train",
        val_url="file:///data/v/attempt-1/val",
        train_rows=20,
        val_rows=5,
        quarantined=0,
        label_map={"a": 0},
        image_shape=(8, 8, 1),
        quarantine_path="/data/v/attempt-1/quarantine.csv",
        train_row_groups=8,
        val_row_groups=5,
    )
    check_reused(PreprocessConfig(input="x", np=5), manifest)
    with pytest.raises(ValueError) as err:
        check_reused(PreprocessConfig(input="x", np=6), manifest)
    assert str(err.value) == (
        "np=6: dataset /data/v/attempt-1 has 5 val row groups, fewer than one per rank: "
        "use np <= 5, or add images"
    )


@pytest.mark.unit
def test_s3_inputs_are_validated_before_listing():
    with pytest.raises(ValueError, match="'digits' writes the bundled digits to a local folder"):
        PreprocessConfig(input="s3://bucket/digits", image_size=(28, 28), input_format="digits")


@pytest.mark.unit
def test_stratified_split_is_deterministic_for_a_seed():
    good = [(f"{label}/{i}", label) for label in "abc" for i in range(10)]
    first = stratified_val_sources(good, 0.3, seed=1)
    assert first == stratified_val_sources(list(reversed(good)), 0.3, seed=1)
    assert first != stratified_val_sources(good, 0.3, seed=2)
    assert sorted(s.split("/")[0] for s in first) == ["a"] * 3 + ["b"] * 3 + ["c"] * 3


@pytest.mark.integration
def test_bundled_digits_go_through_the_same_path(spark, tmp_path):
    config = PreprocessConfig(
        input=str(tmp_path / "digits"),
        input_format="digits",
        output=str(tmp_path / "out"),
        image_size=(8, 8),
    )
    manifest = preprocess_images(spark, config)
    assert manifest.train_rows + manifest.val_rows == 1797
    assert manifest.quarantined == 0
    assert len(os.listdir(tmp_path / "digits" / "7")) == 179  # load_digits has 179 sevens


@pytest.mark.integration
@pytest.mark.parametrize(("size", "np"), [(2, 2), (3, 3), (12, 12)])
def test_every_training_row_is_read_exactly_once_per_epoch_across_ranks(spark, tmp_path, size, np):
    root = make_class_tree(tmp_path / "images", per_class=20)
    manifest = preprocess_images(
        spark,
        PreprocessConfig(
            input=str(root),
            input_format="folders",
            output=str(tmp_path / "out"),
            image_size=(8, 8),
            np=np,
        ),
    )
    assert manifest.train_row_groups >= max(8, np) and manifest.val_row_groups >= max(8, np)
    seen = []
    for rank in range(size):
        with open_dataset(
            manifest.train_url,
            rank=rank,
            size=size,
            batch_size=None,
            num_epochs=1,
            fields=("image", "label", "source"),
            normalize=False,
        ) as ds:
            seen.append([row.source.numpy().decode() for row in ds])
    everything = sorted(r["source"] for r in read_rows(manifest.train_url))
    assert sorted(s for shard in seen for s in shard) == everything
    assert all(shard for shard in seen)  # every rank got rows
    # ... of the validation split too (row groups >= np: every rank has one of its own).
    assert all(read_sources(manifest.val_url, rank, size) for rank in range(size))


@pytest.mark.slow
def test_output_to_the_object_store_is_readable_through_s3fs(spark, store, tmp_path):
    root = make_class_tree(tmp_path / "images", per_class=6)
    output = store.config.uri(store.config.key("datasets"))
    config = PreprocessConfig(
        input=str(root), input_format="folders", output=output, image_size=(8, 8), np=2
    )
    manifest = preprocess_images(spark, config, store=store)
    version = f"{output}/{manifest.fingerprint[:16]}"
    assert manifest.path == f"{version}/{manifest.attempt}"
    assert manifest.train_url == f"{manifest.path}/train"
    keys = store.list_keys(store.config.key("datasets"))
    assert any(k.endswith("/manifest.json") for k in keys)
    assert any("/train/" in k and k.endswith(".parquet") for k in keys)
    assert any(k.endswith("/train/_common_metadata") for k in keys)
    with open_dataset(manifest.train_url, batch_size=None, num_epochs=1, shuffle=False) as ds:
        assert sum(1 for _ in ds) == manifest.train_rows
    assert preprocess_images(spark, config, store=store).reused


@pytest.mark.integration
def test_class_folders_in_a_bucket_with_bad_objects(spark, store, tmp_path):
    root = make_class_tree(tmp_path / "images", per_class=20)
    expected_bad = add_bad_files(root)
    expected_good = good_sources(root, expected_bad)
    input_uri = upload_tree(store, root, "raw")
    output = store.config.uri(store.config.key("datasets"))
    config = PreprocessConfig(
        input=input_uri,
        input_format="folders",
        output=output,
        image_size=(12, 10),
        color_mode="RGB",
        max_pixels=200 * 200,
        max_bad_fraction=0.2,
    )
    manifest = preprocess_images(spark, config, store=store)

    _, expected_val = val_picks(root, expected_bad, 0.2, seed=0)
    assert (manifest.train_rows, manifest.val_rows, manifest.quarantined) == (
        60 - len(expected_val),
        len(expected_val),
        5,
    )
    assert manifest.label_map == {"cat": 0, "dog": 1, "emu": 2}
    # Every good image exactly once across the splits, read back from the bucket.
    train, val = read_sources(manifest.train_url), read_sources(manifest.val_url)
    assert sorted(train + val) == expected_good
    assert sorted(val) == expected_val  # 4 picks of each class's 22, 22 and 21 objects
    # The quarantine report is in the bucket, next to the dataset it belongs to.
    assert manifest.quarantine_path.startswith(f"{output}/{manifest.fingerprint[:16]}/")
    text = store.get_bytes(manifest.quarantine_path).decode()
    report = {row["source"]: row["reason"] for row in csv.DictReader(io.StringIO(text))}
    assert set(report) == set(expected_bad)
    for source, reason in expected_bad.items():
        assert report[source].startswith(reason), (source, report[source])
    assert list(report) == sorted(report)
    keys = store.list_keys(store.config.key("datasets"))
    attempt = f"/{manifest.fingerprint[:16]}/{manifest.attempt}/"
    assert all(
        attempt in k or k.endswith(f"{manifest.fingerprint[:16]}/manifest.json") for k in keys
    )
    assert preprocess_images(spark, config, store=store).reused


@pytest.mark.integration
def test_mnist_idx_files_in_a_bucket(spark, store, tmp_path):
    rng = np.random.default_rng(2)
    images = rng.integers(0, 255, (50, 28, 28), dtype=np.uint8)
    labels = np.arange(50) % 10
    (tmp_path / "idx").mkdir()
    write_idx(tmp_path / "idx" / "train-images-idx3-ubyte", images, gz=True)
    write_idx(tmp_path / "idx" / "train-labels-idx1-ubyte", labels, gz=True)
    write_idx(tmp_path / "idx" / "t10k-images-idx3-ubyte", images[:30], gz=False)
    write_idx(tmp_path / "idx" / "t10k-labels-idx1-ubyte", labels[:30], gz=False)
    input_uri = upload_tree(store, tmp_path / "idx", "mnist")
    config = PreprocessConfig(
        input=input_uri,
        image_size=(28, 28),
        input_format="mnist_idx",
        output=str(tmp_path / "out"),
        val_fraction=0.25,
    )
    manifest = preprocess_images(spark, config, store=store)
    assert (manifest.train_rows, manifest.val_rows, manifest.quarantined) == (60, 20, 0)
    rows = read_rows(manifest.train_url) + read_rows(manifest.val_url)
    assert sorted(r["source"] for r in rows) == sorted(
        [f"train-images-idx3-ubyte.gz#{i}" for i in range(50)]
        + [f"t10k-images-idx3-ubyte#{i}" for i in range(30)]
    )
    assert all(r["label"] == int(r["source"].split("#")[1]) % 10 for r in rows)
    with stored_rows(manifest.val_url) as ds:
        for row in ds:
            name, index = row.source.numpy().decode().split("#")
            assert np.array_equal(row.image.numpy(), images[int(index)]), name


@pytest.mark.integration
def test_the_fingerprint_of_an_s3_input_follows_the_objects_etags(store, tmp_path):
    root = make_class_tree(tmp_path / "images", per_class=2)
    input_uri = upload_tree(store, root, "raw")
    config = PreprocessConfig(input=input_uri, input_format="folders", image_size=(28, 28))

    def fingerprint():
        return sources.fingerprint(preprocess_job.list_inputs(config), config.params())

    first = fingerprint()
    listing = preprocess_job.list_inputs(config)
    assert [item.source for item in listing.items][:2] == ["cat/0.jpg", "cat/1.png"]
    assert fingerprint() == first  # listing again changes nothing

    # Same key, same size, other bytes: only the ETag tells.
    key = store.config.key("raw", "dog", "0.png")
    data = bytearray(store.get_bytes(store.config.uri(key)))
    data[-1] ^= 0xFF
    store.put_bytes(bytes(data), store.config.uri(key), content_type="image/png")
    assert fingerprint() != first
    data[-1] ^= 0xFF
    store.put_bytes(bytes(data), store.config.uri(key), content_type="image/png")
    assert fingerprint() == first  # the same content again: the same ETag


@pytest.mark.integration
def test_a_retry_after_a_crash_mid_write_has_every_row_once(spark, tmp_path):
    root = make_class_tree(tmp_path / "images", per_class=20)
    expected = good_sources(root, {})
    out = tmp_path / "out"
    config = PreprocessConfig(
        input=str(root), input_format="folders", output=str(out), image_size=(8, 8)
    )
    # The write task of partition 1 dies (os._exit) right after its first file is complete.
    with worker_variable(spark, CRASH_AFTER_FIRST_FILE_ENV, "1"):
        # Spark reports the dead worker as a crash or as the broken pipe its writer saw.
        with pytest.raises(Exception):  # noqa: B017 - the files below show what happened
            preprocess_images(spark, config)
    (version,) = out.iterdir()
    (crashed,) = version.iterdir()  # the attempt, and no manifest
    assert crashed.name.startswith("attempt-")
    assert (crashed / "train" / "part-00001.parquet").exists()  # a real part file
    assert not (crashed / "val" / "part-00001.parquet").exists()  # ... of a write cut short

    manifest = preprocess_images(spark, config)
    assert not manifest.reused and manifest.attempt != crashed.name
    read = read_sources(manifest.train_url) + read_sources(manifest.val_url)
    assert sorted(read) == expected  # every row once: nothing of the crashed attempt
    assert manifest.train_rows + manifest.val_rows == len(expected)
    # The crashed attempt stays until it is a day old: a run started alongside this one could
    # still be writing an attempt that young. No manifest names it; a later publication
    # removes it.
    names = sorted(p.name for p in version.iterdir())
    assert names == sorted([crashed.name, manifest.attempt, "manifest.json"])
    later = time.time() + STALE_ATTEMPT_S + 60
    assert removable_attempts(names, manifest.attempt, None, later) == [crashed.name]


@pytest.mark.integration
def test_an_input_folder_missing_on_an_executor_fails_naming_host_and_path(
    spark, tmp_path, monkeypatch
):
    root = make_class_tree(tmp_path / "images", per_class=10)
    real_list_inputs = preprocess_job.list_inputs

    def listed_on_the_driver_only(config, access=None):
        # The driver lists the folder; then it is gone, as on executors that do not mount it.
        listing = real_list_inputs(config, access)
        root.rename(tmp_path / "elsewhere")
        return listing

    monkeypatch.setattr(preprocess_job, "list_inputs", listed_on_the_driver_only)
    config = PreprocessConfig(
        input=str(root),
        input_format="folders",
        image_size=(28, 28),
        output=str(tmp_path / "out"),
        np=2,
    )
    with pytest.raises(RuntimeError) as err:
        preprocess_images(spark, config)
    message = str(err.value)
    assert f"input folder {str(root)!r} does not exist on executor host " in message
    assert repr(socket.gethostname()) in message
    assert "a path every executor sees" in message
    assert not (tmp_path / "out").exists()  # nothing quarantined, nothing written
