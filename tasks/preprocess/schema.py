"""The Petastorm Unischema of hvdflow's image datasets."""

from __future__ import annotations

import numpy as np
from petastorm.codecs import CompressedImageCodec, ScalarCodec
from petastorm.unischema import Unischema, UnischemaField
from pyspark.sql.types import IntegerType, StringType


def image_shape(image_size: tuple[int, int], color_mode: str) -> tuple[int, ...]:
    height, width = image_size
    return (height, width) if color_mode == "L" else (height, width, 3)


def image_schema(image_size: tuple[int, int], color_mode: str) -> Unischema:
    """image (PNG-compressed uint8), label index, source path, split."""
    return Unischema(
        "HvdflowImages",
        [
            UnischemaField(
                "image",
                np.uint8,
                image_shape(image_size, color_mode),
                CompressedImageCodec("png"),
                False,
            ),
            UnischemaField("label", np.int32, (), ScalarCodec(IntegerType()), False),
            UnischemaField("source", np.str_, (), ScalarCodec(StringType()), False),
            UnischemaField("split", np.str_, (), ScalarCodec(StringType()), False),
        ],
    )
