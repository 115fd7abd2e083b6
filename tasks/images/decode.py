"""One input's bytes to records: ``Good`` (the image, upright, in 8 bits, fitted to the size asked)
or ``Bad`` (why it cannot be used).

Images are decoded with ``hvdflow.serving.images``, the code the registered model carries. A bad
file becomes a ``Bad`` record with a reason a person can act on (sniff.py names a file that is
no image), so one corrupt image never fails a job.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from hvdflow.serving.images import UnreadableImage, decode, fit
from hvdflow.tasks.images.sniff import what_it_is


class Good(NamedTuple):
    source: str
    label: str
    image: np.ndarray  # uint8, (H, W) for L, (H, W, 3) for RGB


class Bad(NamedTuple):
    source: str
    reason: str


def decode_image(source: str, label: str, data: bytes, image_size, color_mode, max_pixels):
    """One image file's bytes to a Good record, or a Bad one saying why not."""
    try:
        return Good(source, label, decode(data, image_size, color_mode, max_pixels))
    except UnreadableImage as e:
        return Bad(source, (e.unidentified and what_it_is(data)) or e.reason)


def decode_idx(
    name: str,
    start: int,
    count: int,
    pixels: bytes,
    labels: bytes,
    rows,
    cols,
    image_size,
    color_mode,
):
    """Good records for the complete IDX records in ``pixels``/``labels``, Bad for the rest."""
    from PIL import Image

    complete = min(len(pixels) // (rows * cols), len(labels), count)
    images = np.frombuffer(pixels[: complete * rows * cols], np.uint8).reshape(-1, rows, cols)
    for i in range(complete):
        image = Image.fromarray(images[i], mode="L")
        yield Good(f"{name}#{start + i}", str(labels[i]), fit(image, image_size, color_mode))
    for i in range(complete, count):
        yield Bad(f"{name}#{start + i}", "truncated IDX file")
