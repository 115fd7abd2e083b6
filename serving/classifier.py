"""The registered model: an MLflow pyfunc that takes image files and answers with class names.

A registry consumer with only MLflow (``mlflow models serve``, ``mlflow.pyfunc.load_model``,
``mlflow.pyfunc.spark_udf``) sends what they have and gets what they want to read. This class
and ``hvdflow.serving.images`` travel inside the model (pickled by value, see
``hvdflow.serving.package``): loading it needs MLflow, TensorFlow, numpy, pandas and Pillow,
never hvdflow, Spark or Horovod.

Input, a row per image (a pandas DataFrame; JSON ``dataframe_split`` or ``dataframe_records``
for a served model):

- ``image``: the image file's bytes (PNG, JPEG, TIFF, ...; base64 in JSON), decoded, turned
  upright, converted and resized exactly as preprocessing did for the training images;
- or ``pixels``: an image already prepared the way older versions took it, (height, width,
  channels) floats in [0, 1].

Output, a row per input row: ``class_name``, ``class_index`` and ``probability`` of the top
class, and ``error``: why the row's image could not be read (then the other columns are empty;
one bad image never fails the batch). Params: ``top_k`` (above 1 adds ``top_classes`` and
``top_probabilities``) and ``probabilities`` (adds the full vector, in label order).
"""

from __future__ import annotations

import base64
import contextlib
import math
import os
import sys

import mlflow.pyfunc  # noqa: TID253 (the registered model is an MLflow PythonModel)
import numpy as np

from hvdflow.serving.images import MAX_PIXELS, UnreadableImage, decode, model_input

KERAS_ARTIFACT = "keras_model"  # the artifacts key of the Keras model file
AUTOGRAPH_MODULE_PREFIX = "__autograph_generated_file"  # TensorFlow's name for its modules


def keras_2():
    """The Keras 2 that saved the network: tf-keras where it is installed (TensorFlow 2.16+,
    whose tf.keras is Keras 3 unless TF_USE_LEGACY_KERAS was set before it loaded; a serving
    environment has no hvdflow to set it), else TensorFlow 2.15's own tf.keras."""
    try:
        import tf_keras
    except ImportError:
        import tensorflow as tf

        return tf.keras
    return tf_keras


PREDICT_CHUNK = 256  # images per forward pass: bounded memory for a large request


class ImageClassifier(mlflow.pyfunc.PythonModel):
    """Image files in, class names out (see the module doc). ``labels`` are the class names in
    the order of the network's outputs; ``input_shape`` is (height, width, channels)."""

    def __init__(self, labels, input_shape, max_pixels: int = MAX_PIXELS):
        height, width, channels = (int(d) for d in input_shape)
        if channels not in (1, 3):
            raise ValueError(f"input_shape {tuple(input_shape)}: expected 1 or 3 channels")
        self.labels = [str(label) for label in labels]
        self.input_shape = (height, width, channels)
        self.color_mode = "L" if channels == 1 else "RGB"
        self.max_pixels = int(max_pixels)
        self.network = None  # the Keras model, loaded by load_context

    def __getstate__(self):
        # The network is an artifact of its own, never part of the pickle.
        return {**self.__dict__, "network": None}

    def load_context(self, context) -> None:
        self.network = keras_2().models.load_model(context.artifacts[KERAS_ARTIFACT], compile=False)

    def probabilities(self, batch: np.ndarray) -> np.ndarray:
        """The network's class probabilities for prepared inputs (batch, height, width,
        channels), float32 in [0, 1]."""
        if len(batch) == 0:
            return np.zeros((0, len(self.labels)), np.float32)
        before = autograph_modules()
        parts = [
            np.asarray(self.network.predict_on_batch(batch[i : i + PREDICT_CHUNK]))
            for i in range(0, len(batch), PREDICT_CHUNK)
        ]
        forget_sources(autograph_modules() - before)
        return np.concatenate(parts)

    def prepare(self, image=None, pixels=None) -> np.ndarray:
        """One row's input as the network takes it (height, width, channels); UnreadableImage
        saying why not."""
        if _given(image):
            if isinstance(image, str):  # base64 that no schema decoded (no signature in force)
                image = base64.b64decode(image)
            data = decode(bytes(image), self.input_shape[:2], self.color_mode, self.max_pixels)
            return model_input([data])[0]
        if _given(pixels):
            array = np.asarray(_nested(pixels), dtype=np.float32)
            if array.ndim == 2:
                array = array[..., np.newaxis]
            if array.shape != self.input_shape:
                raise UnreadableImage(
                    f"pixels of shape {array.shape}: this model takes {self.input_shape} "
                    "(height, width, channels), floats in [0, 1]; or send the image file as image"
                )
            return array
        raise UnreadableImage("neither image (the file's bytes) nor pixels given")

    def predict(self, context, model_input, params=None):
        import pandas as pd

        params = params or {}
        frame = model_input if isinstance(model_input, pd.DataFrame) else pd.DataFrame(model_input)
        images = frame["image"] if "image" in frame else [None] * len(frame)
        pixels = frame["pixels"] if "pixels" in frame else [None] * len(frame)
        prepared, errors = [], []
        for image, values in zip(images, pixels, strict=True):
            try:
                prepared.append(self.prepare(image, values))
                errors.append(None)
            except UnreadableImage as e:
                errors.append(e.reason)
        batch = np.stack(prepared) if prepared else np.zeros((0, *self.input_shape), np.float32)
        return self.answer(self.probabilities(batch), errors, params)

    def answer(self, probabilities: np.ndarray, errors: list, params: dict):
        """The output frame: a row per input, the probabilities of the readable ones in order."""
        import pandas as pd

        top_k = int(params.get("top_k") or 1)
        rows, good = [], iter(probabilities)
        for error in errors:
            if error is not None:
                rows.append({"class_name": None, "class_index": None, "probability": None})
                continue
            vector = next(good)
            best = int(vector.argmax())
            row = {
                "class_name": self.labels[best],
                "class_index": best,
                "probability": float(vector[best]),
            }
            if top_k > 1:
                order = np.argsort(-vector, kind="stable")[:top_k]
                row["top_classes"] = [self.labels[i] for i in order]
                row["top_probabilities"] = [float(vector[i]) for i in order]
            if params.get("probabilities"):
                row["probabilities"] = [float(p) for p in vector]
            rows.append(row)
        frame = pd.DataFrame(rows)
        frame["class_index"] = frame["class_index"].astype("Int64")
        frame["error"] = errors
        return frame


def autograph_modules() -> set[str]:
    """The names of the modules AutoGraph has written and loaded in this process."""
    return {name for name in sys.modules if name.startswith(AUTOGRAPH_MODULE_PREFIX)}


def forget_sources(names: set[str]) -> None:
    """Remove the source files of the AutoGraph modules ``names`` (Keras' predict function,
    converted on the first predict), and the bytecode Python cached for them beside
    (``__pycache__``, left in /tmp by each scoring executor: the soak of 2026-11-29). They are
    loaded by then and only serve a traceback's source lines; AutoGraph removes the sources at
    exit, which the processes that serve this model often never reach: pyspark's workers end
    with ``os._exit``, a served model's workers are terminated."""
    for name in names:
        module = sys.modules.get(name)
        for path in (getattr(module, "__file__", None), getattr(module, "__cached__", None)):
            if path and os.path.isfile(path):
                os.remove(path)
        cached = getattr(module, "__cached__", None)
        if cached:
            with contextlib.suppress(OSError):  # not empty: another process's modules
                os.rmdir(os.path.dirname(cached))


def _given(value) -> bool:
    if value is None:
        return False
    if isinstance(value, float) and math.isnan(value):  # a missing cell of a pandas column
        return False
    return True


def _nested(values):
    """A JSON-decoded nested list (or an object array of arrays) as one nested list."""
    if isinstance(values, np.ndarray) and values.dtype == object:
        return [_nested(v) for v in values]
    return values
