"""A small real Horovod job: a dense classifier on scikit-learn's bundled handwritten digits.

Each rank trains on its own shard; ``hvd.DistributedOptimizer`` averages the gradients, so every
rank must end with the same weights. The job returns each rank's weight checksum (gathered on
every rank) so a caller can check exactly that: it is the quickest proof that a cluster, the
launcher and Horovod's Gloo allreduce work together.
"""

from __future__ import annotations

import hashlib
import os
import socket

import numpy as np

from hvdflow.training.autograph import run_horovod_unconverted
from hvdflow.training.digits import bundled_digits
from hvdflow.training.engines import HOROVOD, TF_COLLECTIVE, say_joined, start_engine
from hvdflow.training.optimizers import scaled_learning_rate
from hvdflow.training.threads import share_cores, use_threads


def weights_sha256(weights) -> str:
    """One digest over every weight array's bytes, in layer order."""
    digest = hashlib.sha256()
    for w in weights:
        digest.update(w.tobytes())
    return digest.hexdigest()


def train_digits(epochs: int = 2, batch_size: int = 32, learning_rate: float = 0.05) -> dict:
    """Train on the digits with Horovod; return size, per-rank checksums, where each rank ran
    and the final metrics."""
    import horovod.tensorflow as hvd_tf
    import horovod.tensorflow.keras as hvd
    import tensorflow as tf

    from hvdflow.training.callbacks import LogCallback  # noqa: PLC0415 (lazy: it loads TensorFlow)

    hvd.init()
    run_horovod_unconverted()
    threads = share_cores(hvd.local_size())
    use_threads(threads)
    say_joined(hvd.rank(), hvd.size(), HOROVOD, threads)

    images, labels = bundled_digits()
    images = (images.reshape(len(images), -1) / 16.0).astype("float32")
    shard = slice(hvd.rank(), None, hvd.size())  # every rank sees different examples
    model = tf.keras.Sequential(
        [
            tf.keras.layers.Input(shape=(64,)),
            tf.keras.layers.Dense(32, activation="relu"),
            tf.keras.layers.Dense(10, activation="softmax"),
        ]
    )
    lr = scaled_learning_rate(learning_rate, hvd.size())
    optimizer = hvd.DistributedOptimizer(tf.keras.optimizers.SGD(lr))
    model.compile(optimizer, "sparse_categorical_crossentropy", metrics=["accuracy"])
    history = model.fit(
        images[shard],
        labels[shard],
        batch_size=batch_size,
        epochs=epochs,
        shuffle=False,
        verbose=2 if hvd.rank() == 0 else 0,
        callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0), LogCallback(hvd.rank())],
    )
    checksums = hvd_tf.allgather_object(weights_sha256(model.get_weights()))
    # Where each rank ran, as Horovod saw it: the host, the address it was given and the
    # interface Gloo used (a smoke test's first question on a new cluster).
    where = {
        "host": socket.gethostname(),
        "address": os.environ.get("HOROVOD_HOSTNAME"),
        "interface": os.environ.get("HOROVOD_GLOO_IFACE"),
    }
    return {
        "size": hvd.size(),
        "checksums": list(checksums),
        "ranks": list(hvd_tf.allgather_object(where)),
        "loss": float(history.history["loss"][-1]),
        "accuracy": float(history.history["accuracy"][-1]),
    }


def train_digits_tf(epochs: int = 2, batch_size: int = 32, learning_rate: float = 0.05) -> dict:
    """``train_digits`` on TensorFlow's MultiWorkerMirroredStrategy instead of Horovod.

    Run it with ``HorovodRunner(np=2, options=LaunchOptions(engine="tf_collective"))`` or
    ``MirroredStrategyRunner``: each worker trains on its own shard with its own batches, as the
    Horovod version does.
    """
    import tensorflow as tf

    from hvdflow.training.callbacks import LogCallback  # noqa: PLC0415 (lazy: it loads TensorFlow)

    engine = start_engine(TF_COLLECTIVE)
    images, labels = bundled_digits()
    images = (images.reshape(len(images), -1) / 16.0).astype("float32")
    shard = slice(engine.rank, None, engine.size)
    steps = len(images) // engine.size // batch_size  # the same on every worker
    with engine.scope():
        model = tf.keras.Sequential(
            [
                tf.keras.layers.Input(shape=(64,)),
                tf.keras.layers.Dense(32, activation="relu"),
                tf.keras.layers.Dense(10, activation="softmax"),
            ]
        )
        lr = scaled_learning_rate(learning_rate, engine.size)
        model.compile(tf.keras.optimizers.SGD(lr), "sparse_categorical_crossentropy", ["accuracy"])
    dataset = tf.data.Dataset.from_tensor_slices((images[shard], labels[shard]))
    history = model.fit(
        engine.distribute(dataset.batch(batch_size).repeat()),
        epochs=epochs,
        steps_per_epoch=steps,
        verbose=2 if engine.rank == 0 else 0,
        callbacks=[LogCallback(engine.rank)],
    )
    # Every worker's checksum, gathered by the strategy's own collective.
    digest = np.frombuffer(bytes.fromhex(weights_sha256(model.get_weights())), np.uint8)
    mine = engine.strategy.experimental_distribute_values_from_function(
        lambda _context: tf.constant(digest.astype(np.int32))[tf.newaxis, :]
    )
    gathered = engine.strategy.gather(mine, axis=0).numpy()
    return {
        "size": engine.size,
        "checksums": [bytes(row.astype(np.uint8)).hex() for row in gathered],
        "loss": float(history.history["loss"][-1]),
        "accuracy": float(history.history["accuracy"][-1]),
    }
