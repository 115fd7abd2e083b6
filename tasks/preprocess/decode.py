"""Executor side of preprocessing: one input item in, decoded images or quarantine records out.

Every failure becomes a ``Bad`` record with a reason a person can act on; nothing raises out
of here, so one bad file never fails the job.
"""

from __future__ import annotations

import os
from typing import NamedTuple

import numpy as np

# Modes Pillow converts to L/RGB without losing meaning. 32-bit integer/float and 16-bit modes
# (medical, scientific images) need a scaling decision hvdflow does not guess.
SUPPORTED_MODES = {"1", "L", "LA", "P", "PA", "RGB", "RGBA", "RGBX", "CMYK", "YCbCr"}


class Good(NamedTuple):
    source: str
    label: str
    image: np.ndarray  # uint8, (H, W) for L, (H, W, 3) for RGB


class Bad(NamedTuple):
    source: str
    reason: str


def decode_item(item, image_size: tuple[int, int], color_mode: str, max_pixels: int):
    """Yield Good/Bad records for a file item or an IDX record range."""
    if item.index is None:
        yield _decode_file(item, image_size, color_mode, max_pixels)
    else:
        yield from _decode_idx(item, image_size, color_mode)


def _fit(image, image_size, color_mode) -> np.ndarray:
    from PIL import Image

    image = image.convert(color_mode)
    height, width = image_size
    if image.size != (width, height):
        image = image.resize((width, height), Image.BILINEAR)
    return np.asarray(image, dtype=np.uint8)


def _decode_file(item, image_size, color_mode, max_pixels):
    from PIL import Image, UnidentifiedImageError

    try:
        size = os.path.getsize(item.path)
    except OSError as e:
        return Bad(item.source, f"cannot read the file: {e.strerror}")
    if size == 0:
        return Bad(item.source, "empty file (0 bytes)")
    # Pillow's own guard would raise or only warn depending on how far the limit is exceeded;
    # hvdflow checks the header's size itself before decoding anything.
    Image.MAX_IMAGE_PIXELS = None
    try:
        with Image.open(item.path) as image:
            width, height = image.size
            if width * height > max_pixels:
                return Bad(
                    item.source,
                    f"{width}x{height} = {width * height} pixels is above max_pixels="
                    f"{max_pixels} (decompression bomb guard): raise max_pixels if it is real",
                )
            if image.mode not in SUPPORTED_MODES:
                return Bad(item.source, f"unsupported image mode {image.mode!r}")
            image.load()  # a truncated file fails here, not at open
            return Good(item.source, item.label, _fit(image, image_size, color_mode))
    except UnidentifiedImageError:
        return Bad(item.source, "not an image file Pillow can read")
    except (OSError, SyntaxError, ValueError) as e:
        return Bad(item.source, f"corrupt or truncated image: {e}")


def _decode_idx(item, image_size, color_mode):
    from PIL import Image

    from tasks.preprocess.sources import _open_idx, read_idx_header

    try:
        _, (_, rows, cols) = read_idx_header(item.path)
        with _open_idx(item.path) as f:
            f.seek(16 + item.index * rows * cols)
            pixels = f.read(item.count * rows * cols)
        with _open_idx(item.labels_path) as f:
            f.seek(8 + item.index)
            labels = f.read(item.count)
    except (OSError, ValueError, EOFError) as e:
        yield Bad(item.source, f"unreadable IDX records: {e}")
        return
    complete = min(len(pixels) // (rows * cols), len(labels))
    images = np.frombuffer(pixels[: complete * rows * cols], np.uint8).reshape(-1, rows, cols)
    for i in range(complete):
        source = f"{os.path.basename(item.path)}#{item.index + i}"
        image = Image.fromarray(images[i], mode="L")
        yield Good(source, str(labels[i]), _fit(image, image_size, color_mode))
    for i in range(complete, item.count):
        yield Bad(f"{os.path.basename(item.path)}#{item.index + i}", "truncated IDX file")
