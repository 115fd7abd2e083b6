"""Models built inside ranks (and on the driver to stage their initial weights).

``mnist_cnn`` is the Databricks HorovodRunner example CNN the paper benchmarked; ``vgg16`` and
``inceptionv3`` are keras.applications bases (no top, as for transfer learning) with a new
classifier head; ``digits_mlp`` is a small model for the bundled 8x8 digits.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

# name -> (default input shape, builder(input_shape, num_classes))
_BUILDERS: dict[str, tuple[tuple[int, int, int], Callable]] = {}


@dataclass(frozen=True)
class Recipe:
    """How a model trains by default: the optimizer and base learning rate (for one rank;
    ``hvdflow.training.optimizers`` scales it for more) and the warm-up epochs to the scaled rate.
    Chosen so that np=1, 2 and 4 end at the same accuracy (docs/learning-rate.md)."""

    optimizer: str
    learning_rate: float
    warmup_epochs: float
    # The global batch stays the one-rank batch, split among the ranks (no scaling, no
    # warm-up): what made np=2 reach its target sooner than np=1 in every repetition
    # (docs/learning-rate.md, "Global batch or per-rank batch").
    global_batch: bool = False


_RECIPES: dict[str, Recipe] = {}


def _register(name: str, input_shape: tuple[int, int, int], defaults: Recipe):
    def wrap(fn):
        _BUILDERS[name] = (input_shape, fn)
        _RECIPES[name] = defaults
        return fn

    return wrap


def model_names() -> list[str]:
    return sorted(_BUILDERS)


def recipe(name: str) -> Recipe:
    """``name``'s default optimizer, learning rate and warm-up."""
    _lookup(name)  # the error naming the choices
    return _RECIPES[name.lower()]


def default_input_shape(name: str) -> tuple[int, int, int]:
    return _lookup(name)[0]


def model_input_shape(image_shape) -> tuple[int, int, int]:
    """The models' input shape for a dataset's image shape: grayscale images get a channel axis."""
    shape = tuple(image_shape)
    return shape if len(shape) == 3 else (*shape, 1)


def _lookup(name: str):
    key = name.lower()
    if key not in _BUILDERS:
        raise ValueError(f"model {name!r} is unknown: expected one of {model_names()}")
    return _BUILDERS[key]


def build_model(
    name: str,
    input_shape: tuple[int, int, int] | None = None,
    num_classes: int = 10,
    seed: int | None = None,
):
    """An uncompiled Keras model. ``seed`` makes the initial weights reproducible."""
    import tensorflow as tf

    default_shape, builder = _lookup(name)
    if seed is not None:
        tf.keras.utils.set_random_seed(seed)
    return builder(tuple(input_shape or default_shape), num_classes)


@_register("digits_mlp", (8, 8, 1), Recipe("adam", 0.01, 1.0))
def _digits_mlp(input_shape, num_classes):
    import tensorflow as tf

    return tf.keras.Sequential(
        [
            tf.keras.layers.Input(shape=input_shape),
            tf.keras.layers.Flatten(),
            tf.keras.layers.Dense(32, activation="relu"),
            tf.keras.layers.Dense(num_classes, activation="softmax"),
        ],
        name="digits_mlp",
    )


@_register("mnist_cnn", (28, 28, 1), Recipe("adam", 0.001, 1.0, global_batch=True))
def _mnist_cnn(input_shape, num_classes):
    import tensorflow as tf

    layers = tf.keras.layers
    return tf.keras.Sequential(
        [
            layers.Input(shape=input_shape),
            layers.Conv2D(32, kernel_size=(3, 3), activation="relu"),
            layers.Conv2D(64, (3, 3), activation="relu"),
            layers.MaxPooling2D(pool_size=(2, 2)),
            layers.Dropout(0.25),
            layers.Flatten(),
            layers.Dense(128, activation="relu"),
            layers.Dropout(0.5),
            layers.Dense(num_classes, activation="softmax"),
        ],
        name="mnist_cnn",
    )


def _application(base_fn, input_shape, num_classes, name):
    import tensorflow as tf

    base = base_fn(include_top=False, weights=None, input_shape=input_shape, pooling="avg")
    outputs = tf.keras.layers.Dense(num_classes, activation="softmax")(base.output)
    return tf.keras.Model(base.input, outputs, name=name)


@_register("vgg16", (224, 224, 3), Recipe("sgd", 0.01, 1.0))
def _vgg16(input_shape, num_classes):
    import tensorflow as tf

    return _application(tf.keras.applications.VGG16, input_shape, num_classes, "vgg16")


@_register("inceptionv3", (299, 299, 3), Recipe("sgd", 0.01, 1.0))
def _inceptionv3(input_shape, num_classes):
    import tensorflow as tf

    return _application(tf.keras.applications.InceptionV3, input_shape, num_classes, "inceptionv3")
