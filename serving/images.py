"""How an image file becomes what the model sees: the one copy of that code.

Preprocessing (``hvdflow.tasks.preprocess``), ``hvdflow score`` and the registered model itself
(``hvdflow.serving.classifier``, which carries this module inside the model) all call
``decode`` and ``model_input``, so a served prediction equals a batch prediction. Only numpy
and Pillow: a registry consumer loads it without hvdflow.

``decode`` takes a file's bytes to 8-bit L or RGB pixels of one size, or raises
``UnreadableImage`` saying why. ``unsupported_mode`` says, before anything is decoded, why an
image's samples cannot be turned into 8 bits without guessing. ``upright_8bit`` takes a decoded
image to what is stored:

- turned upright by its EXIF Orientation (a phone photo taken sideways is stored sideways with a
  tag saying so), before the resize, so the model sees what a person sees;
- CMYK JPEGs with the polarity their writer used: Pillow reads every CMYK JPEG as Adobe's
  inverted CMYK (what Photoshop writes, with its APP14 "Adobe" marker), which is right for
  those; one *without* the marker stores plain CMYK and is inverted back here (as libvips, Skia
  and pdf.js decide, by the marker);
- unsigned 16-bit grayscale (16-bit PNG, TIFF and PGM) scaled to 8 bits by the full 16-bit
  range: ``round(value / 257)``, so 0 -> 0, 65535 -> 255, and 8-bit data stored in 16 bits the
  usual way (``value * 257``) comes back exactly. Not stretched per image between its own
  minimum and maximum: that would give the same stored pixels to a dark and a bright image of
  the same scene, and make an image's brightness depend on its other pixels. Data that uses
  fewer bits (12-bit sensors) is therefore stored dark, as it is in the file.
"""

from __future__ import annotations

import io

import numpy as np

# Pixels an image may have before it is refused undecoded (a decompression bomb guard).
MAX_PIXELS = 50_000_000

# Modes with 8-bit samples, which Pillow converts to L/RGB without losing meaning.
EIGHT_BIT_MODES = {"1", "L", "LA", "P", "PA", "RGB", "RGBA", "RGBX", "CMYK", "YCbCr"}
# Unsigned 16-bit grayscale: scaled to 8 bits by the full 16-bit range (see the module doc).
SIXTEEN_BIT_MODES = {"I;16", "I;16L", "I;16B", "I;16N"}
# Every mode that decodes. Mode "I" (32-bit integer) is one too when its file stores unsigned
# 16-bit samples (a 16-bit PGM, or a 16-bit PNG or TIFF in other Pillow versions); 32-bit
# integer, signed and floating-point samples have no known range to scale to 8 bits: hvdflow
# does not guess one, and quarantines them (UNSUPPORTED_WHY says why, in the report).
SUPPORTED_MODES = EIGHT_BIT_MODES | SIXTEEN_BIT_MODES
UNSUPPORTED_WHY = {
    "F": "32-bit floating-point samples, whose range is unknown: no scaling to 8 bits is safe",
    "I": "32-bit or signed integer samples, whose range is unknown: no scaling to 8 bits is safe",
    "LAB": "a color space hvdflow does not convert",
    "HSV": "a color space hvdflow does not convert",
}
# Formats whose Pillow reader scales every mode "I" image to 0..65535.
_SIXTEEN_BIT_FORMATS = {"PPM"}  # a PGM with maxval > 255: Pillow scales it to 0..65535
_EXIF_ORIENTATION = 0x0112


def unsupported_mode(image) -> str | None:
    """Why an opened (not yet loaded) image cannot become 8-bit L/RGB, or None when it can."""
    if image.mode in SUPPORTED_MODES or _is_sixteen_bit(image):
        return None
    why = UNSUPPORTED_WHY.get(image.mode, "not one hvdflow converts")
    return (
        f"unsupported image mode {image.mode!r} ({why}): convert it to 8- or 16-bit grayscale, "
        "RGB or RGBA"
    )


def upright_8bit(image):
    """A loaded image that ``unsupported_mode`` accepted, upright, in one of EIGHT_BIT_MODES
    (see the module doc)."""
    from PIL import ImageChops, ImageOps

    # Mode "I" gets here only with 16-bit samples (unsupported_mode read its tiles).
    sixteen_bit = image.mode in SIXTEEN_BIT_MODES or image.mode == "I"
    plain_cmyk = image.mode == "CMYK" and image.format == "JPEG" and "adobe" not in image.info
    if _orientation(image) != 1:
        image = ImageOps.exif_transpose(image)
    if plain_cmyk:
        image = ImageChops.invert(image)
    if sixteen_bit:
        image = sixteen_to_eight_bits(image)
    return image


def sixteen_to_eight_bits(image):
    """An unsigned 16-bit grayscale image as 8-bit L: ``round(value / 257)``."""
    from PIL import Image

    values = np.clip(np.asarray(image).astype(np.int64), 0, 65535)
    return Image.fromarray(((values + 128) // 257).astype(np.uint8), "L")


def _orientation(image) -> int:
    """The EXIF Orientation (1: as stored). A damaged EXIF block never costs an image its
    pixels: it reads as 1."""
    try:
        return int(image.getexif().get(_EXIF_ORIENTATION, 1))
    except Exception:  # any parse error of the metadata (struct.error, SyntaxError, ...)
        return 1


def _is_sixteen_bit(image) -> bool:
    """Whether a mode "I" image holds unsigned 16-bit samples (read from its tiles: call this
    before ``load``, which drops them)."""
    if image.mode != "I":
        return False
    if image.format in _SIXTEEN_BIT_FORMATS:
        return True
    rawmodes = {_rawmode(tile.args) for tile in getattr(image, "tile", ())}
    return bool(rawmodes) and rawmodes <= SIXTEEN_BIT_MODES  # the raw modes of 16-bit files


def _rawmode(args) -> str:
    if isinstance(args, str):
        return args
    return args[0] if args and isinstance(args[0], str) else ""


class UnreadableImage(Exception):
    """An image file ``decode`` cannot turn into pixels; ``reason`` says why, for a person.
    ``unidentified``: Pillow did not recognise the format at all (the caller may know better
    what the bytes are)."""

    def __init__(self, reason: str, unidentified: bool = False):
        super().__init__(reason)
        self.reason = reason
        self.unidentified = unidentified


def decode(data: bytes, image_size, color_mode: str, max_pixels: int = MAX_PIXELS) -> np.ndarray:
    """An image file's bytes to uint8 pixels (height, width) for "L" or (height, width, 3) for
    "RGB": upright, 8-bit, resized to ``image_size`` (height, width). UnreadableImage if not."""
    from PIL import Image, UnidentifiedImageError

    if not data:
        raise UnreadableImage("empty file (0 bytes)")
    # Pillow's own guard would raise or only warn depending on how far the limit is exceeded;
    # the header's size is checked here before anything is decoded.
    Image.MAX_IMAGE_PIXELS = None
    try:
        with Image.open(io.BytesIO(data)) as image:
            width, height = image.size
            if width * height > max_pixels:
                raise UnreadableImage(
                    f"{width}x{height} = {width * height} pixels is above max_pixels="
                    f"{max_pixels} (decompression bomb guard): raise max_pixels if it is real"
                )
            reason = unsupported_mode(image)
            if reason is not None:
                raise UnreadableImage(reason)
            image.load()  # a truncated file fails here, not at open
            return fit(upright_8bit(image), image_size, color_mode)
    except UnidentifiedImageError:
        raise UnreadableImage("not an image file Pillow can read", unidentified=True) from None
    except (OSError, SyntaxError, ValueError) as e:
        raise UnreadableImage(f"corrupt or truncated image: {e}") from None


def fit(image, image_size, color_mode: str) -> np.ndarray:
    """A Pillow image in ``color_mode``, resized (bilinear) to ``image_size`` (height, width)."""
    from PIL import Image

    image = image.convert(color_mode)
    height, width = image_size
    if image.size != (width, height):
        image = image.resize((width, height), Image.BILINEAR)
    return np.asarray(image, dtype=np.uint8)


def model_input(images) -> np.ndarray:
    """Decoded uint8 images to the model's input, as training reads them: float32 in [0, 1]
    with a channel axis (batch, height, width, channels)."""
    batch = np.stack(images).astype(np.float32) / 255.0
    return batch[..., np.newaxis] if batch.ndim == 3 else batch
