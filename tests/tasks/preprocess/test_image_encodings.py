"""data.image_encoding: 'raw', the pixels stored as they are, read back by the pyarrow reader as
the PNG dataset of the same images reads; 'jpeg', decoded alike by both readers and close to
the PNG twin's pixels."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from hvdflow.flows.params import PipelineParams
from hvdflow.infra import extras
from hvdflow.infra.storage.files import Location
from hvdflow.tasks.images.encode import encode_image
from hvdflow.tasks.preprocess import PreprocessConfig, preprocess_images
from hvdflow.tasks.preprocess.publish import read_manifest
from hvdflow.tasks.score.inputs import list_dataset
from hvdflow.training import parquet_reader
from hvdflow.training.parquet_reader import FieldDescription


def twins(spark, tmp_path, encoding: str):
    """The bundled digits preprocessed at 28x28 twice: as PNG, and stored as ``encoding``."""
    manifests = []
    for stored in ("png", encoding):
        config = PreprocessConfig(
            input=str(tmp_path / "digits"),
            input_format="digits",
            output=str(tmp_path / stored),
            image_size=(28, 28),
            image_encoding=stored,
        )
        manifests.append(preprocess_images(spark, config))
    return manifests


@pytest.mark.integration
@pytest.mark.current
def test_a_raw_dataset_reads_back_the_pixels_of_its_png_twin(spark, tmp_path):
    png, raw = twins(spark, tmp_path, "raw")
    assert png.fingerprint != raw.fingerprint  # two datasets, not one reused
    for url in ("train_url", "val_url"):
        ours = parquet_reader.load_shard(getattr(raw, url))
        theirs = parquet_reader.load_shard(getattr(png, url))
        assert all(np.array_equal(a, b) for a, b in zip(ours, theirs, strict=True))
    # Published and complete without Petastorm's metadata, wherever Petastorm is installed.
    version = Path(raw.path).parent
    assert read_manifest(Location(str(version))) is not None
    assert list(version.rglob("_common_metadata")) == []
    # Scoring decodes encoded images: it refuses a raw dataset, saying why.
    with pytest.raises(ValueError, match="stores raw pixels"):
        list_dataset(str(version))


@pytest.mark.unit
@pytest.mark.parametrize("shape", [(8, 8), (5, 7, 3)])
def test_raw_pixels_round_trip_and_a_damaged_value_is_named(shape):
    import pyarrow as pa

    rng = np.random.default_rng(0)
    images = [rng.integers(0, 256, size=shape, dtype=np.uint8) for _ in range(4)]
    field = FieldDescription("image", "uint8", shape, "raw")
    column = pa.array([encode_image(image, shape, "raw") for image in images], pa.binary())
    assert np.array_equal(parquet_reader._decoded(field, column), np.stack(images))
    short = pa.array([encode_image(images[0], shape, "raw")[:-1]], pa.binary())
    with pytest.raises(ValueError, match=r"but a value has \d+ bytes: the split is damaged"):
        parquet_reader._decoded(field, short)


@pytest.mark.unit
def test_a_raw_dataset_trains_with_the_pyarrow_reader_and_refuses_petastorms():
    assert PipelineParams(data={"image_encoding": "raw"}).training.reader == "pyarrow"
    # Where Petastorm is not installed (current profile), asking for its reader fails first.
    refusal = (
        "cannot read data.image_encoding='raw'"
        if extras.installed(extras.PETASTORM)
        else r"hvdflow\[petastorm\]"
    )
    with pytest.raises((ValueError, extras.MissingExtra), match=refusal):
        PipelineParams(data={"image_encoding": "raw"}, training={"reader": "petastorm"})
    # PNG datasets keep the fingerprints they had before the option existed.
    assert "image_encoding" not in PreprocessConfig().params()
    assert PreprocessConfig(image_encoding="raw").params()["image_encoding"] == "raw"


@pytest.mark.integration
@pytest.mark.current
def test_a_jpeg_dataset_reads_alike_with_both_readers_near_its_png_twins_pixels(spark, tmp_path):
    png, jpeg = twins(spark, tmp_path, "jpeg")
    description = parquet_reader.read_description(jpeg.train_url)
    assert description.field("image").codec == "jpeg"
    ours = parquet_reader.load_shard(jpeg.train_url)
    twin = parquet_reader.load_shard(png.train_url)
    assert ours[0].shape == twin[0].shape and np.array_equal(ours[1], twin[1])
    # Lossy, but at quality 95 within a few grey levels of the lossless pixels on average.
    assert 0 < np.abs(ours[0].astype(int) - twin[0].astype(int)).mean() < 4
    if extras.installed(extras.PETASTORM):  # Petastorm's reader: its metadata, the same pixels
        from hvdflow.training.reader import load_shard

        theirs = load_shard(jpeg.train_url, reader="petastorm")
        assert all(np.array_equal(a, b) for a, b in zip(ours, theirs, strict=True))
    assert list_dataset(str(Path(jpeg.path).parent)).units  # scoring takes it


@pytest.mark.unit
def test_a_jpegs_size_comes_from_its_frame_header_and_anything_else_has_none():
    import cv2  # noqa: TID253

    image = np.random.default_rng(0).integers(0, 256, size=(5, 7, 3), dtype=np.uint8)
    data = encode_image(image, (5, 7, 3), "jpeg")
    assert cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_UNCHANGED).shape == (5, 7, 3)
    assert parquet_reader._jpeg_size(data) == (5, 7)
    assert parquet_reader._jpeg_size(encode_image(image, (5, 7, 3), "png")) is None
    assert parquet_reader._jpeg_size(data[:4]) is None
