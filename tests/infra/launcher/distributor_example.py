"""spark-tensorflow-distributor's README example, as its users wrote it, with one import changed.

Run as a script (``python tests/infra/launcher/distributor_example.py``): it prints the chief's
result as JSON on its last line. MNIST is replaced by random images of the same shape, since
nothing can be downloaded here; everything else is the README's code.
"""

import json

from hvdflow import MirroredStrategyRunner  # was: from spark_tensorflow_distributor import ...


# Adapted from https://www.tensorflow.org/tutorials/distribute/multi_worker_with_keras
def train():
    import numpy as np
    import tensorflow as tf

    BUFFER_SIZE = 10000
    BATCH_SIZE = 64

    def make_datasets():
        rng = np.random.default_rng(0)
        mnist_images = rng.integers(0, 256, size=(1024, 28, 28), dtype=np.uint8)
        mnist_labels = rng.integers(0, 10, size=(1024,))

        dataset = tf.data.Dataset.from_tensor_slices(
            (
                tf.cast(mnist_images[..., tf.newaxis] / 255.0, tf.float32),
                tf.cast(mnist_labels, tf.int64),
            )
        )
        dataset = dataset.repeat().shuffle(BUFFER_SIZE).batch(BATCH_SIZE)
        return dataset

    def build_and_compile_cnn_model():
        model = tf.keras.Sequential(
            [
                tf.keras.layers.Conv2D(32, 3, activation="relu", input_shape=(28, 28, 1)),
                tf.keras.layers.MaxPooling2D(),
                tf.keras.layers.Flatten(),
                tf.keras.layers.Dense(64, activation="relu"),
                tf.keras.layers.Dense(10, activation="softmax"),
            ]
        )
        model.compile(
            loss=tf.keras.losses.sparse_categorical_crossentropy,
            optimizer=tf.keras.optimizers.SGD(learning_rate=0.001),
            metrics=["accuracy"],
        )
        return model

    train_datasets = make_datasets()
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
    train_datasets = train_datasets.with_options(options)
    multi_worker_model = build_and_compile_cnn_model()
    history = multi_worker_model.fit(x=train_datasets, epochs=3, steps_per_epoch=5)
    # Not in the README: what the test checks (the workers and their identical weights).
    import hashlib

    strategy = tf.distribute.get_strategy()
    digest = hashlib.sha256(b"".join(w.tobytes() for w in multi_worker_model.get_weights()))
    return {
        "workers": strategy.num_replicas_in_sync,
        "strategy": type(strategy).__name__,
        "weights_sha256": digest.hexdigest(),
        "epochs": len(history.history["loss"]),
    }


if __name__ == "__main__":
    result = MirroredStrategyRunner(num_slots=2, use_gpu=False).run(train)
    print(json.dumps(result))
