"""Input that still broke preprocessing, through its plan and its Spark job: every fault made
for real on disk and the exact outcome asserted (the listing, reading and decoding of each
fault alone: tests/tasks/images/test_bad_input.py)."""

from __future__ import annotations

import csv
import logging
import os

import numpy as np
import pytest
from PIL import Image

from hvdflow.tasks.images import sniff
from hvdflow.tasks.images.listing import list_class_folders
from hvdflow.tasks.preprocess import PreprocessConfig, preprocess_images
from hvdflow.tasks.preprocess import plan as preprocess_plan
from tests.tasks.images.test_bad_input import (
    F_MODE,
    png,
    sixteen_bit_gradient,
    symlink,
    write_16_bit,
    write_cmyk_jpeg,
    write_exif_rotated,
)
from tests.tasks.preprocess.test_job import make_class_tree, stored_rows

# --- class folders without images --------------------------------------------------------------


@pytest.mark.unit
def test_class_folders_without_files_to_decode_are_left_out_of_the_labels(tmp_path, caplog):
    png(tmp_path / "ant" / "1.png")
    (tmp_path / "bee").mkdir()  # nothing at all
    png(tmp_path / "cow" / "2.png")
    symlink(tmp_path / "doe" / "gone.jpg", "missing.jpg")  # only an unusable entry
    (tmp_path / "elk").mkdir()
    (tmp_path / "elk" / ".DS_Store").write_bytes(b"\0")  # only a hidden file
    png(tmp_path / "fox" / "deep" / "3.png")  # images in a sub-folder count

    with caplog.at_level(logging.WARNING, logger="hvdflow.tasks.images.listing"):
        listing = list_class_folders(str(tmp_path))
    assert listing.labels == ["ant", "cow", "fox"]
    assert [r.getMessage() for r in caplog.records] == [
        f"class folder {str(tmp_path / 'bee')!r} has no files to decode: it is left out of "
        "the classes",
        f"class folder {str(tmp_path / 'doe')!r} has no files to decode (only 1 unusable, see "
        "quarantine.csv): it is left out of the classes",
        f"class folder {str(tmp_path / 'elk')!r} has no files to decode: it is left out of "
        "the classes",
    ]
    # The unusable entry of a left-out class is still quarantined.
    assert [(i.source, i.label, i.problem is None) for i in listing.items] == [
        ("ant/1.png", "ant", True),
        ("cow/2.png", "cow", True),
        ("doe/gone.jpg", "doe", False),
        ("fox/deep/3.png", "fox", True),
    ]
    config = PreprocessConfig(
        input=str(tmp_path), input_format="folders", image_size=(28, 28), val_fraction=0.0
    )
    split = preprocess_plan.plan_split(config, listing, None)
    assert split.label_index == {"ant": 0, "cow": 1, "fox": 2}  # contiguous, in name order
    assert split.per_item == [(1, 0), (1, 0), (0, 0), (1, 0)]  # nothing planned for doe


@pytest.mark.unit
def test_a_tree_of_only_unusable_entries_fails_before_any_spark_work(tmp_path):
    symlink(tmp_path / "in" / "cat" / "gone.jpg", "missing.jpg")
    config = PreprocessConfig(
        input=str(tmp_path / "in"),
        input_format="folders",
        image_size=(28, 28),
        output=str(tmp_path / "out"),
    )
    with pytest.raises(ValueError) as err:
        preprocess_images(None, config)  # no Spark session: it must not be needed
    assert str(err.value) == (
        f"no images found in {str(tmp_path / 'in')!r} (folders) (only unusable entries: 1, "
        "e.g. cat/gone.jpg: broken symbolic link: it points to 'missing.jpg', which does not "
        "exist): expected one sub-folder per class with image files inside"
    )
    assert not (tmp_path / "out").exists()


# --- all of it, through the Spark job ----------------------------------------------------------


def add_odd_files(root, elsewhere):
    """Odd inputs next to the good images of make_class_tree (cat, dog, emu): the ones that
    decode, {source: check of its stored pixels}; the ones quarantined, {source: reason}."""
    gradient = sixteen_bit_gradient(16, 8)  # the stored size: no resize
    write_16_bit(root / "cat" / "deep.png", np.full((8, 16), 257 * 100, np.uint16), "png")
    write_16_bit(root / "cat" / "deep.tif", gradient, "tiff-big-endian")
    write_16_bit(root / "cat" / "deep.pgm", np.full((8, 16), 257 * 30, np.uint16), "pgm")
    write_cmyk_jpeg(root / "emu" / "adobe_red.jpg", (0, 255, 255, 0), adobe=True)
    write_cmyk_jpeg(root / "emu" / "plain_red.jpg", (0, 255, 255, 0), adobe=False)
    write_exif_rotated(root / "emu" / "sideways.jpg", 6)
    symlink(root / "dog" / "alias.png", "../cat/1.png")
    png(elsewhere / "far.png", value=77)
    symlink(root / "dog" / "far", str(elsewhere))

    def is_red(image):
        return image[..., 0].mean() > 230 and image[..., 1:].mean() < 25

    good = {
        "cat/deep.png": lambda image: (image == 100).all(),
        "cat/deep.tif": lambda image: np.array_equal(
            image[..., 1], (gradient.astype(int) + 128) // 257
        ),
        "cat/deep.pgm": lambda image: (image == 30).all(),
        "emu/adobe_red.jpg": is_red,
        "emu/plain_red.jpg": is_red,
        "emu/sideways.jpg": lambda image: image[:8].mean() > 100 > image[8:].mean(),
        "dog/alias.png": lambda image: image.shape == (16, 8, 3),
        "dog/far/far.png": lambda image: (image == 77).all(),
    }

    symlink(root / "cat" / "broken.jpg", "missing.jpg")
    symlink(root / "cat" / "loop1.jpg", "loop2.jpg")
    symlink(root / "cat" / "loop2.jpg", "loop1.jpg")
    symlink(root / "dog" / "again", ".")
    (root / "dog" / "page.jpg").write_text("<!doctype html><html><body>429</body></html>")
    (root / "dog" / "api.png").write_text('{"error": "rate limit exceeded"}')
    (root / "emu" / "error.jpg").write_text("<?xml version='1.0'?><Error><Code>SlowDown</Code>")
    Image.fromarray(np.ones((8, 8), np.float32)).save(root / "emu" / "float.tif")
    os.mkfifo(root / "emu" / "pipe.png")
    (root / "fox").mkdir()  # an empty class folder
    symlink(root / "gnu" / "gone.jpg", "../nowhere.jpg")  # a class folder of one broken link
    loop = "and following the links never reaches a file"
    bad = {
        "cat/broken.jpg": "broken symbolic link: it points to 'missing.jpg', which does not exist",
        "cat/loop1.jpg": f"symbolic link loop: it points to 'loop2.jpg', {loop}",
        "cat/loop2.jpg": f"symbolic link loop: it points to 'loop1.jpg', {loop}",
        "dog/again": "symbolic link loop: it points to '.', a folder that contains it",
        "dog/page.jpg": sniff.HTML,
        "dog/api.png": sniff.JSON,
        "emu/error.jpg": sniff.XML,
        "emu/float.tif": F_MODE,
        "emu/pipe.png": "not a regular file but a named pipe: it is never read",
        "gnu/gone.jpg": "broken symbolic link: it points to '../nowhere.jpg', which does not exist",
    }
    return good, bad


@pytest.mark.integration
def test_odd_files_are_quarantined_with_their_reason_and_odd_images_become_rows(spark, tmp_path):
    root = make_class_tree(tmp_path / "images", per_class=8)
    good, bad = add_odd_files(root, tmp_path / "elsewhere")
    config = PreprocessConfig(
        input=str(root),
        input_format="folders",
        output=str(tmp_path / "out"),
        image_size=(16, 8),
        color_mode="RGB",
        max_bad_fraction=0.3,
        np=2,
    )
    manifest = preprocess_images(spark, config)

    assert manifest.label_map == {"cat": 0, "dog": 1, "emu": 2}  # no fox, no gnu
    with open(manifest.quarantine_path) as f:
        report = {(row["source"], row["reason"]) for row in csv.DictReader(f)}
    assert report == set(bad.items())
    assert manifest.quarantined == len(bad)
    stored = {}
    for url in (manifest.train_url, manifest.val_url):
        with stored_rows(url) as ds:
            stored.update({row.source.numpy().decode(): row.image.numpy() for row in ds})
    assert len(stored) == manifest.train_rows + manifest.val_rows == 3 * 8 + len(good)
    for source, looks_right in good.items():
        assert looks_right(stored[source]), source
