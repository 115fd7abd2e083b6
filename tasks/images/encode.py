"""Images into the bytes a dataset stores (``data.image_encoding``): PNG, encoded exactly as
Petastorm's ``CompressedImageCodec("png")`` does (OpenCV, BGR), so every reader gets the same
pixels whether or not Petastorm wrote them; or raw pixels, which cost no decoding.
"""

from __future__ import annotations

import numpy as np

# Petastorm passes a JPEG quality to every encoder (PNG ignores it): the same call, same bytes.
_PETASTORM_QUALITY = 80


def encode_image(image: np.ndarray, shape: tuple[int, ...], encoding: str) -> bytes:
    """``image`` as a dataset stores it: ``png`` (``encode_png``) or ``raw``: its uint8 pixels
    in C order, which the pyarrow reader reshapes to the field's shape."""
    if encoding == "raw":
        _check(image, shape)
        return np.ascontiguousarray(image).tobytes()
    if encoding == "png":
        return encode_png(image, shape)
    raise ValueError(f"image encoding {encoding!r}: expected png or raw")


def _check(image: np.ndarray, shape: tuple[int, ...]) -> None:
    if image.dtype != np.uint8:
        raise ValueError(f"expected a uint8 image, got {image.dtype}")
    if tuple(image.shape) != tuple(shape):
        raise ValueError(f"expected an image of shape {tuple(shape)}, got {tuple(image.shape)}")


def encode_png(image: np.ndarray, shape: tuple[int, ...]) -> bytes:
    """``image`` (uint8, ``shape``: (height, width) or (height, width, 3) RGB) as PNG bytes."""
    import cv2  # noqa: TID253 (OpenCV: loaded by the executors that write images)

    _check(image, shape)
    if image.ndim == 3 and image.shape[2] == 3:
        image = image[:, :, (2, 1, 0)]  # RGB to BGR, as OpenCV writes it
    elif image.ndim != 2:
        raise ValueError(f"expected (H, W) or (H, W, 3), got {tuple(image.shape)}")
    ok, contents = cv2.imencode(".png", image, [int(cv2.IMWRITE_JPEG_QUALITY), _PETASTORM_QUALITY])
    if not ok:
        raise ValueError(f"OpenCV could not encode an image of shape {tuple(image.shape)} as PNG")
    return contents.tobytes()
