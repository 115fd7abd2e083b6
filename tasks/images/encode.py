"""Images into the bytes a dataset stores (``data.image_encoding``): PNG or JPEG, encoded as
Petastorm's ``CompressedImageCodec`` does (OpenCV, BGR), so every reader gets the same pixels
whether or not Petastorm wrote them; or raw pixels, which cost no decoding.
"""

from __future__ import annotations

import numpy as np

# Petastorm passes a JPEG quality to every encoder (PNG ignores it): the same call, same bytes.
_PETASTORM_QUALITY = 80
# JPEG's: near-lossless for photos, a third of PNG's bytes and cheaper to decode (data.md).
JPEG_QUALITY = 95


def encode_image(image: np.ndarray, shape: tuple[int, ...], encoding: str) -> bytes:
    """``image`` as a dataset stores it: ``png`` (``encode_png``) or ``raw``: its uint8 pixels
    in C order, which the pyarrow reader reshapes to the field's shape."""
    if encoding == "raw":
        _check(image, shape)
        return np.ascontiguousarray(image).tobytes()
    if encoding in ("png", "jpeg"):
        return encode_png(image, shape, encoding)
    raise ValueError(f"image encoding {encoding!r}: expected png, jpeg or raw")


def _check(image: np.ndarray, shape: tuple[int, ...]) -> None:
    if image.dtype != np.uint8:
        raise ValueError(f"expected a uint8 image, got {image.dtype}")
    if tuple(image.shape) != tuple(shape):
        raise ValueError(f"expected an image of shape {tuple(shape)}, got {tuple(image.shape)}")


def encode_png(image: np.ndarray, shape: tuple[int, ...], encoding: str = "png") -> bytes:
    """``image`` (uint8, ``shape``: (height, width) or (height, width, 3) RGB) as PNG bytes, or
    as JPEG's at JPEG_QUALITY (``encoding="jpeg"``)."""
    import cv2  # noqa: TID253 (OpenCV: loaded by the executors that write images)

    _check(image, shape)
    if image.ndim == 3 and image.shape[2] == 3:
        image = image[:, :, (2, 1, 0)]  # RGB to BGR, as OpenCV writes it
    elif image.ndim != 2:
        raise ValueError(f"expected (H, W) or (H, W, 3), got {tuple(image.shape)}")
    quality = JPEG_QUALITY if encoding == "jpeg" else _PETASTORM_QUALITY
    extension = ".jpg" if encoding == "jpeg" else ".png"
    ok, contents = cv2.imencode(extension, image, [int(cv2.IMWRITE_JPEG_QUALITY), quality])
    if not ok:
        raise ValueError(
            f"OpenCV could not encode an image of shape {tuple(image.shape)} as {encoding}"
        )
    return contents.tobytes()
