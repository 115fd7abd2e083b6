"""Optimizers the paper compared, built by name, with the learning rate already scaled."""

from __future__ import annotations

OPTIMIZERS = ("adadelta", "rmsprop", "adam", "radam", "sgd")


def scaled_learning_rate(learning_rate: float, ranks: int) -> float:
    """The learning rate scaled by the number of ranks, as Horovod recommends."""
    return learning_rate * abs(ranks)


def make_optimizer(name: str, learning_rate: float):
    """A Keras optimizer; ``radam`` is Rectified Adam from tensorflow-addons (as in the paper)."""
    import tensorflow as tf

    key = name.lower()
    if key == "adadelta":
        return tf.keras.optimizers.Adadelta(learning_rate)
    if key == "rmsprop":
        return tf.keras.optimizers.RMSprop(learning_rate)
    if key == "adam":
        return tf.keras.optimizers.Adam(learning_rate)
    if key == "sgd":
        return tf.keras.optimizers.SGD(learning_rate)
    if key == "radam":
        try:
            import tensorflow_addons as tfa
        except ImportError:
            raise RuntimeError(
                "optimizer 'radam' needs tensorflow-addons 0.23 (TF 2.15): pip install "
                "tensorflow-addons==0.23.0, or pick one of adadelta, rmsprop, adam, sgd"
            ) from None
        return tfa.optimizers.RectifiedAdam(learning_rate)
    raise ValueError(f"optimizer {name!r} is unknown: expected one of {OPTIMIZERS}")
