"""Each split's JSON description (``_hvdflow_schema.json``): written by preprocessing beside
Petastorm's metadata, from the same fields as the Unischema."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from hvdflow.tasks.preprocess.schema import image_fields, image_schema
from hvdflow.tasks.preprocess.write import SPLITS, write_split_description
from hvdflow.training.parquet_reader import SCHEMA_FILE, read_description

# Petastorm's key for the row groups per file in _common_metadata
# (petastorm.etl.dataset_metadata.ROW_GROUPS_PER_FILE_KEY), spelled out: no Petastorm needed.
ROW_GROUPS_PER_FILE_KEY = b"dataset-toolkit.num_row_groups_per_file.v1"


@pytest.mark.unit
@pytest.mark.parametrize("color_mode, shape", [("L", (28, 28)), ("RGB", (32, 24, 3))])
def test_the_unischema_and_the_description_have_the_same_fields(color_mode, shape):
    codecs = pytest.importorskip("petastorm.codecs")  # the classic profile's
    size = shape[:2]
    unischema = image_schema(size, color_mode)
    described = image_fields(size, color_mode)
    assert [f.name for f in described] == list(unischema.fields)
    for field in described:
        theirs = unischema.fields[field.name]
        assert np.dtype(field.dtype) == np.dtype(theirs.numpy_dtype)
        assert field.shape == theirs.shape
        codec = codecs.CompressedImageCodec if field.codec == "png" else codecs.ScalarCodec
        assert type(theirs.codec) is codec
    assert described[0].shape == shape and described[0].codec == "png"


@pytest.mark.unit
def test_a_written_description_reads_back(tmp_path):
    fields = image_fields((8, 8), "L")
    row_groups = {"part-00001.parquet": 2, "part-00000.parquet": 3}
    url = write_split_description(str(tmp_path), fields, row_groups, None)
    assert url == str(tmp_path / SCHEMA_FILE)
    assert json.loads(Path(url).read_text()) == {
        "format": "hvdflow-split",
        "version": 1,
        "fields": [
            {"name": "image", "dtype": "uint8", "shape": [8, 8], "codec": "png"},
            {"name": "label", "dtype": "int32", "shape": [], "codec": "scalar"},
            {"name": "source", "dtype": "str", "shape": [], "codec": "scalar"},
            {"name": "split", "dtype": "str", "shape": [], "codec": "scalar"},
        ],
        "row_groups": {"part-00000.parquet": 3, "part-00001.parquet": 2},
    }
    described = read_description(str(tmp_path))
    assert described.fields == fields and described.row_groups == row_groups


@pytest.mark.integration
def test_preprocessing_describes_every_split(digits_dataset):
    """Each split folder holds the description: the fields, and every part file with the row
    groups it really has (what Petastorm's metadata says too)."""
    groups = {}
    for split in SPLITS:
        folder = Path(digits_dataset.path) / split
        record = json.loads((folder / SCHEMA_FILE).read_text())
        assert [(f["name"], f["dtype"], f["shape"], f["codec"]) for f in record["fields"]] == [
            ("image", "uint8", [8, 8], "png"),
            ("label", "int32", [], "scalar"),
            ("source", "str", [], "scalar"),
            ("split", "str", [], "scalar"),
        ]
        parts = sorted(p.name for p in folder.glob("*.parquet"))
        assert sorted(record["row_groups"]) == parts
        for name, count in record["row_groups"].items():
            assert pq.ParquetFile(folder / name).num_row_groups == count
        common = pq.read_metadata(folder / "_common_metadata").metadata
        assert json.loads(common[ROW_GROUPS_PER_FILE_KEY]) == record["row_groups"]
        groups[split] = sum(record["row_groups"].values())
    assert groups == {
        "train": digits_dataset.train_row_groups,
        "val": digits_dataset.val_row_groups,
    }
