"""Preprocessing onto a disk that fills during the write: a real tmpfs too small for the dataset.
The run fails with a DiskFullError that says where and that nothing was published; the attempt's
files are gone, and once there is room the next run makes the dataset (no half-written attempt
is taken for it)."""

from __future__ import annotations

import pytest

from hvdflow.infra.errors import DiskFullError
from hvdflow.tasks.preprocess import PreprocessConfig, preprocess_images
from tests.helpers import resize_disk, small_disk
from tests.tasks.preprocess.test_job import make_class_tree

pytestmark = pytest.mark.integration


def test_a_disk_that_fills_during_the_write_publishes_nothing(spark, tmp_path):
    # 60 noise images of 64x64 RGB: about 12 KiB each once stored, far past the disk's 256 KiB.
    root = make_class_tree(tmp_path / "images", per_class=20, size=(64, 64))
    with small_disk(tmp_path / "disk", 256) as disk:
        config = PreprocessConfig(
            input=str(root),
            input_format="folders",
            output=str(disk / "datasets"),
            image_size=(64, 64),
            color_mode="RGB",
            np=2,
        )
        with pytest.raises(DiskFullError) as failed:
            preprocess_images(spark, config)
        message = str(failed.value)
        assert f"writing the dataset to {disk / 'datasets'}/" in message
        assert "no space left on device" in message and "Nothing was published" in message
        assert "set data.output" in message
        assert [p for p in disk.rglob("*") if p.is_file()] == []

        resize_disk(disk, 8192)
        manifest = preprocess_images(spark, config)
        assert not manifest.reused  # no earlier attempt passed for the dataset
        assert manifest.train_rows + manifest.val_rows == 60
