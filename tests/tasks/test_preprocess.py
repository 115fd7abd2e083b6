"""Preprocessing on generated files in each input format, on the session's local[2] Spark."""

from __future__ import annotations

import csv
import gzip
import json
import os
import struct

import numpy as np
import pyarrow.parquet as pq
import pytest
from PIL import Image

from tasks.preprocess import PreprocessConfig, preprocess_images
from tasks.preprocess.job import stratified_val_sources
from training.reader import open_dataset


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
        "dog/notes.txt": "not an image file Pillow can read",
        "dog/float.tif": "unsupported image mode 'F'",
        "emu/bomb.png": f"{big_side}x{big_side} = {big_side * big_side} pixels is above max_pixels",
    }


def read_rows(url, columns=("label", "source", "split")):
    return pq.read_table(url.replace("file://", ""), columns=list(columns)).to_pylist()


@pytest.mark.integration
def test_class_folders_with_bad_files_are_quarantined_not_fatal(spark, tmp_path):
    root = make_class_tree(tmp_path / "images")
    expected_bad = add_bad_files(root)
    config = PreprocessConfig(
        input=str(root),
        output=str(tmp_path / "out"),
        image_size=(12, 10),
        color_mode="RGB",
        val_fraction=0.2,
        max_pixels=200 * 200,
        max_bad_fraction=0.2,
    )
    manifest = preprocess_images(spark, config)

    assert (manifest.train_rows, manifest.val_rows, manifest.quarantined) == (24, 6, 5)
    assert manifest.label_map == {"cat": 0, "dog": 1, "emu": 2}
    assert manifest.image_shape == (12, 10, 3)
    train, val = read_rows(manifest.train_url), read_rows(manifest.val_url)
    assert len(train) == 24 and len(val) == 6
    # Stratified: every class keeps 2 of its 10 images for validation.
    assert sorted(r["label"] for r in val) == [0, 0, 1, 1, 2, 2]
    assert {r["split"] for r in train} == {"train"} and {r["split"] for r in val} == {"val"}
    assert not {r["source"] for r in train} & {r["source"] for r in val}
    # The Petastorm schema is stored with the dataset, and the images decode to the shape.
    with open_dataset(manifest.train_url, batch_size=None, num_epochs=1, shuffle=False) as ds:
        image, label = next(iter(ds))
    assert image.shape == (12, 10, 3) and 0.0 <= float(image.numpy().min()) <= 1.0

    with open(manifest.quarantine_path) as f:
        report = {row["source"]: row["reason"] for row in csv.DictReader(f)}
    assert set(report) == set(expected_bad)
    for source, reason in expected_bad.items():
        assert report[source].startswith(reason), (source, report[source])
    labels = json.loads((tmp_path / "out" / manifest.fingerprint[:16] / "labels.json").read_text())
    assert labels == manifest.label_map


@pytest.mark.integration
def test_same_fingerprint_reuses_and_a_changed_input_writes_a_new_version(spark, tmp_path):
    root = make_class_tree(tmp_path / "images", per_class=4)
    config = PreprocessConfig(input=str(root), output=str(tmp_path / "out"), image_size=(8, 8))
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
    config = PreprocessConfig(input=str(root), output=str(tmp_path / "out"), max_bad_fraction=0.5)
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
        preprocess_images(spark, PreprocessConfig(input=str(tmp_path / "empty")))
    with pytest.raises(ValueError, match="is not a directory of class sub-folders"):
        preprocess_images(spark, PreprocessConfig(input=str(tmp_path / "missing")))


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
    with open_dataset(
        manifest.train_url,
        batch_size=None,
        num_epochs=1,
        shuffle=False,
        normalize=False,
        fields=("image", "source"),
    ) as ds:
        row = next(iter(ds))
    source = row.source.numpy().decode()
    index = int(source.split("#")[1])
    expected = (images if source.startswith("train") else images[:10])[index]
    assert np.array_equal(row.image.numpy(), expected)


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
@pytest.mark.parametrize("size", [2, 3])
def test_every_training_row_is_read_exactly_once_per_epoch_across_ranks(spark, tmp_path, size):
    root = make_class_tree(tmp_path / "images", per_class=20)
    manifest = preprocess_images(
        spark, PreprocessConfig(input=str(root), output=str(tmp_path / "out"), image_size=(8, 8))
    )
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


@pytest.mark.slow
def test_output_to_the_object_store_is_readable_through_s3fs(spark, store, tmp_path):
    root = make_class_tree(tmp_path / "images", per_class=6)
    output = store.config.uri(store.config.key("datasets"))
    config = PreprocessConfig(input=str(root), output=output, image_size=(8, 8))
    manifest = preprocess_images(spark, config, store=store)
    assert manifest.train_url == f"{output}/{manifest.fingerprint[:16]}/train"
    keys = store.list_keys(store.config.key("datasets"))
    assert any(k.endswith("/manifest.json") for k in keys)
    assert any("/train/" in k and k.endswith(".parquet") for k in keys)
    with open_dataset(manifest.train_url, batch_size=None, num_epochs=1, shuffle=False) as ds:
        assert sum(1 for _ in ds) == manifest.train_rows
    assert preprocess_images(spark, config, store=store).reused
