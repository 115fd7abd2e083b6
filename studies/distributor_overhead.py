"""MirroredStrategyRunner against spark-tensorflow-distributor's: where ``run()`` spends its time.

One training function, the paper's MNIST CNN on in-memory images written as a user of the
original writes it (plain Keras, the runner's strategy scope, TensorFlow's tf.data defaults),
runs under ``spark_tensorflow_distributor.MirroredStrategyRunner`` and under
``hvdflow.MirroredStrategyRunner`` (``num_slots=2, use_gpu=False``) on one local[2] session,
alternating, so both see the same machine. The function notes when its body began, when
``fit`` began, when each epoch ended and when ``fit`` returned; the driver notes when ``run``
was called and when it returned. Each run is split into:

- to the body: the Spark job, the worker processes, TensorFlow's import and the strategy;
- to fit: the dataset and the model, built in the function;
- epochs: the first one (tracing included) and the steady ones;
- fit's end: from the last epoch's end to ``fit``'s return (tf.data's autotuning thread, when
  an iterator's deletion waits for it: ``hvdflow.infra.launcher.tf_datasets``);
- after fit: from ``fit``'s return to ``run()``'s, everything the runner does afterwards.

    .venv/bin/python -m studies.distributor_overhead --images 30000 --epochs 3 --rounds 2
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import sys
import time

from hvdflow.infra import LaunchOptions, MirroredStrategyRunner

RUNNERS = ("original", "hvdflow")


def train(images: int, epochs: int, batch: int) -> dict:
    """The user's function: no hvdflow in it, so that both runners run the same code."""
    began = time.time()
    # Imported in the worker, after `began`: loading TensorFlow is part of the function's cost.
    import numpy as np  # noqa: PLC0415
    import tensorflow as tf

    rng = np.random.default_rng(0)
    x = rng.random((images, 28, 28, 1), dtype=np.float32)
    y = rng.integers(0, 10, images)
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).shuffle(images).batch(batch).repeat()
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
    dataset = dataset.with_options(options)
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
    ended: list[float] = []
    stamp = tf.keras.callbacks.LambdaCallback(on_epoch_end=lambda *_: ended.append(time.time()))
    fit_began = time.time()
    steps = images // (batch * 2)  # the global batch is batch x 2 workers
    model.fit(dataset, epochs=epochs, steps_per_epoch=steps, callbacks=[stamp], verbose=0)
    return {"began": began, "fit_began": fit_began, "epoch_ends": ended, "fit_ended": time.time()}


def phases(called: float, returned: float, seen: dict) -> dict[str, float]:
    """A run's seconds by phase, from the driver's two stamps and the function's own."""
    ends = seen["epoch_ends"]
    epochs = [b - a for a, b in zip([seen["fit_began"], *ends], ends, strict=False)]
    return {
        "run": returned - called,
        "to the body": seen["began"] - called,
        "to fit": seen["fit_began"] - seen["began"],
        "first epoch": epochs[0],
        "steady epoch": statistics.median(epochs[1:]) if len(epochs) > 1 else float("nan"),
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
    args = parser.parse_args(argv)
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
    seen: dict[str, list[dict[str, float]]] = {name: [] for name in RUNNERS}
    for round_ in range(args.rounds):
        for name in RUNNERS:
            runner = make[name]()
            called = time.time()
            result = runner.run(train, **kwargs)
            split = phases(called, time.time(), result)
            seen[name].append(split)
            print(json.dumps({"round": round_ + 1, "runner": name, **split}), flush=True)
    print(
        f"\nmedian of {args.rounds} round(s), {args.images} images x {args.epochs} epochs, "
        "num_slots=2, local[2], seconds:"
    )
    print(f"  {'phase':<20}" + "".join(f"{name:>12}" for name in RUNNERS))
    for phase in seen[RUNNERS[0]][0]:
        medians = [statistics.median(s[phase] for s in seen[name]) for name in RUNNERS]
        print(f"  {phase:<20}" + "".join(f"{m:12.1f}" for m in medians))
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
