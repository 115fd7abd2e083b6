"""The fields of hvdflow's image datasets, as plain values, and the Petastorm Unischema built
from them. ``image_fields`` is the one source of both the Unischema and the split's JSON
description (``hvdflow.training.parquet_reader``), so they cannot drift."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from hvdflow.training.parquet_reader import FieldDescription

if TYPE_CHECKING:
    from petastorm.unischema import Unischema


def image_shape(image_size: tuple[int, int], color_mode: str) -> tuple[int, ...]:
    height, width = image_size
    return (height, width) if color_mode == "L" else (height, width, 3)


def image_fields(
    image_size: tuple[int, int], color_mode: str, encoding: str = "png"
) -> tuple[FieldDescription, ...]:
    """image (uint8, PNG or JPEG compressed, or raw: ``encoding``), label index, source, split."""
    return (
        FieldDescription("image", "uint8", image_shape(image_size, color_mode), encoding),
        FieldDescription("label", "int32", (), "scalar"),
        FieldDescription("source", "str", (), "scalar"),
        FieldDescription("split", "str", (), "scalar"),
    )


def image_schema(image_size: tuple[int, int], color_mode: str, encoding: str = "png") -> Unischema:
    """The Petastorm Unischema of ``image_fields`` (the one place Petastorm and Spark load)."""
    from petastorm.codecs import CompressedImageCodec, ScalarCodec  # noqa: PLC0415
    from petastorm.unischema import Unischema, UnischemaField  # noqa: PLC0415
    from pyspark.sql.types import IntegerType, StringType  # noqa: PLC0415

    scalar_types = {"int32": IntegerType, "str": StringType}

    def codec(field: FieldDescription):
        if field.codec in ("png", "jpeg"):
            return CompressedImageCodec(field.codec)
        return ScalarCodec(scalar_types[field.dtype]())

    return Unischema(
        "HvdflowImages",
        [
            UnischemaField(f.name, np.dtype(f.dtype).type, f.shape, codec(f), False)
            for f in image_fields(image_size, color_mode, encoding)
        ],
    )
