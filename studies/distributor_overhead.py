"""MirroredStrategyRunner against spark-tensorflow-distributor's: where ``run()`` spends its time.

    .venv/bin/python -m studies.distributor_overhead --images 30000 --epochs 3 --rounds 2
    .venv/bin/python -m studies.distributor_overhead --shapes arrays,files,generator

One Keras function (the paper's MNIST CNN, tf.data's defaults), written the ways users write it,
under both runners (``num_slots=2, use_gpu=False``) on one local[2] session, alternating. Each
run is split into: to the body, to fit, the epochs, fit's end, and after fit.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import sys
import tempfile
import time

from hvdflow.infra import LaunchOptions, MirroredStrategyRunner

RUNNERS = ("original", "hvdflow")


SHAPES = ("steps", "arrays", "files", "generator")


def train(images: int, epochs: int, batch: int, shape: str = "steps", files: str = "") -> dict:
    """The user's function: no hvdflow in it, so that both runners run the same code.

    ``shape``: how the user feeds ``fit``. ``steps``: in-memory arrays repeated, with
    ``steps_per_epoch`` and DATA sharding set; ``arrays``: the same arrays as
    ``from_tensor_slices(...).shuffle().batch()`` with tf.data's defaults, one pass an epoch (the
    way most Keras tutorials write it); ``files``: TFRecord files under ``files``, listed and
    parsed; ``generator``: a Python generator through ``from_generator``."""
    began = time.time()
    # Imported in the worker, after `began`: loading TensorFlow is part of the function's cost.
    import numpy as np  # noqa: PLC0415
    import tensorflow as tf

    rng = np.random.default_rng(0)
    x = rng.random((images, 28, 28, 1), dtype=np.float32)
    y = rng.integers(0, 10, images)
    steps = None
    if shape == "steps":
        dataset = tf.data.Dataset.from_tensor_slices((x, y)).shuffle(images).batch(batch).repeat()
        options = tf.data.Options()
        policy = tf.data.experimental.AutoShardPolicy.DATA
        options.experimental_distribute.auto_shard_policy = policy
        dataset = dataset.with_options(options)
        steps = images // (batch * 2)  # the global batch is batch x 2 workers
    elif shape == "arrays":
        dataset = tf.data.Dataset.from_tensor_slices((x, y)).shuffle(images).batch(batch * 2)
    elif shape == "files":
        spec = {
            "x": tf.io.FixedLenFeature([28 * 28], tf.float32),
            "y": tf.io.FixedLenFeature([], tf.int64),
        }

        def parse(record):
            example = tf.io.parse_single_example(record, spec)
            return tf.reshape(example["x"], (28, 28, 1)), example["y"]

        names = sorted(tf.io.gfile.glob(f"{files}/*.tfrecord"))
        dataset = tf.data.TFRecordDataset(names).map(parse).shuffle(4096).batch(batch * 2)
    else:

        def rows():
            yield from zip(x, y, strict=True)

        signature = (tf.TensorSpec((28, 28, 1), tf.float32), tf.TensorSpec((), tf.int64))
        dataset = tf.data.Dataset.from_generator(rows, output_signature=signature)
        dataset = dataset.batch(batch * 2)
    # The paper's MNIST CNN (Keras' mnist_cnn example), as in hvdflow.training.models.
    model = tf.keras.Sequential(
        [
            tf.keras.layers.Conv2D(32, 3, activation="relu", input_shape=(28, 28, 1)),
            tf.keras.layers.Conv2D(64, 3, activation="relu"),
            tf.keras.layers.MaxPooling2D(),
            tf.keras.layers.Dropout(0.25),
            tf.keras.layers.Flatten(),
            tf.keras.layers.Dense(128, activation="relu"),
            tf.keras.layers.Dropout(0.5),
            tf.keras.layers.Dense(10, activation="softmax"),
        ]
    )
    model.compile(
        optimizer=tf.keras.optimizers.Adadelta(1.0),
        loss="sparse_categorical_crossentropy",
        metrics=["accuracy"],
    )
    begun: list[float] = []
    ended: list[float] = []
    stamp = tf.keras.callbacks.LambdaCallback(
        on_epoch_begin=lambda *_: begun.append(time.time()),
        on_epoch_end=lambda *_: ended.append(time.time()),
    )
    fit_began = time.time()
    model.fit(dataset, epochs=epochs, steps_per_epoch=steps, callbacks=[stamp], verbose=0)
    fit_ended = time.time()
    return {
        "began": began,
        "fit_began": fit_began,
        "epoch_begins": begun,
        "epoch_ends": ended,
        "fit_ended": fit_ended,
    }


def write_records(folder: str, images: int, shards: int = 8) -> None:
    """The ``files`` shape's input: the same kind of images as TFRecord files, in ``shards``."""
    import numpy as np  # noqa: PLC0415
    import tensorflow as tf  # noqa: PLC0415

    rng = np.random.default_rng(0)
    x = rng.random((images, 28 * 28), dtype=np.float32)
    y = rng.integers(0, 10, images)
    for shard in range(shards):
        with tf.io.TFRecordWriter(f"{folder}/part-{shard:02d}.tfrecord") as out:
            for i in range(shard, images, shards):
                features = {
                    "x": tf.train.Feature(float_list=tf.train.FloatList(value=x[i])),
                    "y": tf.train.Feature(int64_list=tf.train.Int64List(value=[int(y[i])])),
                }
                out.write(
                    tf.train.Example(
                        features=tf.train.Features(feature=features)
                    ).SerializeToString()
                )


def phases(called: float, returned: float, seen: dict) -> dict[str, float]:
    """A run's seconds by phase, from the driver's two stamps and the function's own."""
    begins, ends = seen["epoch_begins"], seen["epoch_ends"]
    epochs = [end - begin for begin, end in zip(begins, ends, strict=True)]
    return {
        "run": returned - called,
        "to the body": seen["began"] - called,
        "to fit": seen["fit_began"] - seen["began"],
        "to epoch 1": begins[0] - seen["fit_began"],
        "first epoch": epochs[0],
        "steady epoch": statistics.median(epochs[1:]) if len(epochs) > 1 else float("nan"),
        "between epochs": sum(b - e for e, b in zip(ends, begins[1:], strict=False)),
        "fit's end": seen["fit_ended"] - ends[-1],
        "after fit": returned - seen["fit_ended"],
        "outside the epochs": (returned - called) - sum(epochs),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=30000)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch", type=int, default=128, help="per worker")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument(
        "--shapes",
        default="steps",
        help=f"comma-separated, how the function feeds fit: {', '.join(SHAPES)} (see train)",
    )
    args = parser.parse_args(argv)
    shapes = args.shapes.split(",")
    if unknown := set(shapes) - set(SHAPES):
        parser.error(f"--shapes: unknown {sorted(unknown)}; choose from {', '.join(SHAPES)}")
    logging.basicConfig(level=logging.WARNING)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    try:
        from spark_tensorflow_distributor import (  # noqa: PLC0415 (optional: the peer)
            MirroredStrategyRunner as Original,
        )
    except ImportError:
        print(
            "needs the original: pip install spark-tensorflow-distributor==1.0.0 (the dev extra "
            "has it)"
        )
        return 2

    from hvdflow.infra.spark import get_spark  # noqa: PLC0415 (lazy: it loads Spark)

    spark = get_spark(
        "local[2]",
        "hvdflow-bench",
        {"spark.ui.enabled": "false", "spark.ui.showConsoleProgress": "false"},
    )
    spark.sparkContext.setLogLevel("ERROR")
    make = {
        "original": lambda: Original(num_slots=2, use_gpu=False),
        "hvdflow": lambda: MirroredStrategyRunner(
            num_slots=2, use_gpu=False, options=LaunchOptions(spark=spark)
        ),
    }
    kwargs = {"images": args.images, "epochs": args.epochs, "batch": args.batch}
    files = ""
    if "files" in shapes:
        files = tempfile.mkdtemp(prefix="hvdflow-records-")
        write_records(files, args.images)
    seen = {(shape, name): [] for shape in shapes for name in RUNNERS}
    for round_ in range(args.rounds):
        for shape in shapes:
            for name in RUNNERS:
                runner = make[name]()
                called = time.time()
                result = runner.run(train, **kwargs, shape=shape, files=files)
                split = phases(called, time.time(), result)
                seen[shape, name].append(split)
                line = {"round": round_ + 1, "shape": shape, "runner": name, **split}
                print(json.dumps(line), flush=True)
    for shape in shapes:
        print(
            f"\n{shape}: median of {args.rounds} round(s), {args.images} images x "
            f"{args.epochs} epochs, num_slots=2, local[2], seconds:"
        )
        print(f"  {'phase':<20}" + "".join(f"{name:>12}" for name in RUNNERS))
        for phase in seen[shape, RUNNERS[0]][0]:
            medians = [statistics.median(s[phase] for s in seen[shape, name]) for name in RUNNERS]
            print(f"  {phase:<20}" + "".join(f"{m:12.1f}" for m in medians))
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
