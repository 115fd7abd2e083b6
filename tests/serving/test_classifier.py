"""The registered model's pyfunc on its own: rows in, class names out, bad rows answered."""

from __future__ import annotations

import base64
import io

import numpy as np
import pandas as pd
import pytest
from PIL import Image

from hvdflow.serving.classifier import ImageClassifier
from hvdflow.serving.images import decode, model_input

pytestmark = pytest.mark.unit


class Brightness:
    """A network whose class probabilities follow the mean brightness: predictable by hand."""

    def predict_on_batch(self, batch):
        mean = batch.reshape(len(batch), -1).mean(axis=1)
        return np.stack([1 - mean, mean * 0.25, mean * 0.75], axis=1).astype(np.float32)


def png(pixels: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="PNG")
    return buffer.getvalue()


@pytest.fixture
def model():
    model = ImageClassifier(["dark", "dim", "bright"], (4, 4, 1))
    model.network = Brightness()
    return model


def test_image_bytes_base64_and_prepared_pixels_give_the_same_answer(model):
    white = np.full((8, 8), 255, np.uint8)
    prepared = model_input([decode(png(white), (4, 4), "L")])[0]
    frame = pd.DataFrame(
        {
            "image": [png(white), base64.b64encode(png(white)).decode(), None],
            "pixels": [None, None, prepared.tolist()],
        }
    )
    out = model.predict(None, frame)
    assert out["class_name"].tolist() == ["bright"] * 3
    assert out["class_index"].tolist() == [2] * 3
    assert out["probability"].tolist() == [0.75] * 3
    assert out["error"].isna().all()


def test_a_bad_row_is_answered_with_why_and_the_rest_are_scored(model):
    black = png(np.zeros((3, 5), np.uint8))
    frame = pd.DataFrame(
        {
            "image": [b"not an image", black, None, b""],
            "pixels": [None, None, np.zeros((2, 2, 1)).tolist(), None],
        }
    )
    out = model.predict(None, frame, params={"top_k": 2, "probabilities": True})
    assert out["class_name"].tolist() == [None, "dark", None, None]
    assert out["error"].tolist() == [
        "not an image file Pillow can read",
        None,
        "pixels of shape (2, 2, 1): this model takes (4, 4, 1) (height, width, channels), "
        "floats in [0, 1]; or send the image file as image",
        "empty file (0 bytes)",
    ]
    assert out["top_classes"][1] == ["dark", "dim"]
    assert out["top_probabilities"][1] == [1.0, 0.0]
    assert out["probabilities"][1] == [1.0, 0.0, 0.0]


def test_the_network_is_never_pickled_with_the_model(model):
    import pickle

    assert pickle.loads(pickle.dumps(model)).network is None
