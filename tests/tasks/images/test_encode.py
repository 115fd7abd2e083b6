import numpy as np
import pytest

from hvdflow.serving.images import decode
from hvdflow.tasks.images.encode import encode_png

pytestmark = pytest.mark.unit

SHAPES = [(8, 8), (28, 28), (5, 7, 3), (32, 24, 3)]


def image(shape, seed=0):
    return np.random.default_rng(seed).integers(0, 256, size=shape, dtype=np.uint8)


@pytest.mark.parametrize("shape", SHAPES)
def test_the_bytes_are_petastorms_own(shape):
    # A dataset written where Petastorm is not installed must be the one Petastorm writes.
    codecs = pytest.importorskip("petastorm.codecs")
    unischema = pytest.importorskip("petastorm.unischema")
    field = unischema.UnischemaField("image", np.uint8, shape, codecs.CompressedImageCodec("png"))
    pixels = image(shape)
    assert encode_png(pixels, shape) == bytes(field.codec.encode(field, pixels))


@pytest.mark.parametrize("shape", SHAPES)
def test_serving_reads_back_the_same_pixels(shape):
    pixels = image(shape, seed=1)
    color_mode = "RGB" if len(shape) == 3 else "L"
    back = decode(encode_png(pixels, shape), shape[:2], color_mode)
    assert np.array_equal(back.reshape(shape), pixels)


def test_a_wrong_shape_or_type_is_refused_with_what_was_expected():
    with pytest.raises(ValueError, match=r"expected an image of shape \(8, 8\), got \(8, 9\)"):
        encode_png(image((8, 9)), (8, 8))
    with pytest.raises(ValueError, match="expected a uint8 image, got float32"):
        encode_png(image((8, 8)).astype(np.float32), (8, 8))
