"""Two more knobs on hvd2's step, side by side: the large gradient reduced early, and threads.

TensorFlow's profiler and Horovod's timeline (``bench.step_profile``) put 12-14 ms of hvd2's
140 ms step after the rank's last op: the allreduces' tail, led by the dense layer's 4.7 MB
kernel gradient. TensorFlow's executor decides when that gradient is computed, and on some
steps it comes only after the convolutions' backward pass. The variants, each two ranks of
``HorovodRunner(np=-2)`` over the same in-memory batches (the MNIST CNN, batch 128 per rank,
Adadelta, as ``../shared/tools/hvd_ceiling.py``):

- ``base``: hvdflow's ranks as they are (one thread each, bound to a core each);
- ``early``: the dense kernel's gradient is computed first, and reduced from inside its own
  gradient function, so that its allreduce runs beside the convolutions' backward pass (a
  ``tf.custom_gradient`` with a control dependency; Horovod's optimizer then leaves that
  variable to it);
- ``threads2``: two TensorFlow threads per rank (intra- and inter-op) on both cores;
- ``threads2_inter1``: two intra-op threads and one inter-op thread per rank, on both cores;
- ``grouped``: all gradients in one grouped allreduce (Horovod's ``groups=1``): one
  negotiation a step instead of one per gradient, all of them sent once the last is ready.

Images per second are timed from the first batch's start to the last batch's end. Not
``model.fit``'s wall clock: a ``tf.data`` iterator with autotuning on waits at its deletion for
the autotuner's next wake-up, and that pause rounded whole fits up to the same few values. The
datasets here run without autotuning anyway, as the reader's do.

    .venv/bin/python -m studies.step_order --variants base,early --rounds 3
"""

from __future__ import annotations

import argparse
import json
import os
import time

import numpy as np

from hvdflow.infra import HorovodRunner
from hvdflow.training.reader import without_autotuning

STEPS, WARM, BATCH = 150, 20, 128
VARIANTS = ("base", "early", "threads2", "threads2_inter1", "grouped")


def train_variant(variant: str) -> dict:
    """One rank of ``variant``: steady images/s over STEPS batches, the final loss, and how
    far the ranks' dense kernels drifted apart (0: they stayed equal)."""
    rank = int(os.environ["HOROVOD_LOCAL_RANK"])
    if variant.startswith("threads2"):  # undo the launcher's binding: both cores for each rank
        for thread_id in os.listdir("/proc/self/task"):
            os.sched_setaffinity(int(thread_id), range(os.cpu_count() or 1))
    import horovod.tensorflow as hvd_tf
    import horovod.tensorflow.keras as hvd
    import tensorflow as tf

    hvd.init()
    threads = 2 if variant.startswith("threads2") else 1
    tf.config.threading.set_intra_op_parallelism_threads(threads)
    tf.config.threading.set_inter_op_parallelism_threads(
        1 if variant.endswith("inter1") else threads
    )
    dataset = _batches(tf, rank)
    layers = tf.keras.layers

    class EarlyReducedDense(layers.Dense):
        """A Dense layer whose kernel gradient is computed before its input's, and reduced
        from inside its own gradient function."""

        def call(self, inputs):
            @tf.custom_gradient
            def matmul(x, kernel):
                def grad(upstream):
                    kernel_grad = tf.matmul(x, upstream, transpose_a=True)
                    reduced = hvd_tf.allreduce(kernel_grad, op=hvd_tf.Average, name="early")
                    with tf.control_dependencies([kernel_grad]):
                        input_grad = tf.matmul(upstream, kernel, transpose_b=True)
                    return input_grad, reduced

                return tf.matmul(x, kernel), grad

            return self.activation(tf.nn.bias_add(matmul(inputs, self.kernel), self.bias))

    tf.keras.utils.set_random_seed(0)
    dense = (EarlyReducedDense if variant == "early" else layers.Dense)(128, activation="relu")
    model = tf.keras.Sequential(
        [
            layers.Input((28, 28, 1)),
            layers.Conv2D(32, 3, activation="relu"),
            layers.Conv2D(64, 3, activation="relu"),
            layers.MaxPooling2D(),
            layers.Dropout(0.25),
            layers.Flatten(),
            dense,
            layers.Dropout(0.5),
            layers.Dense(10, activation="softmax"),
        ]
    )
    opt = hvd.DistributedOptimizer(
        tf.keras.optimizers.Adadelta(1.0 * hvd.size()),
        scale_local_gradients=False,
        groups=1 if variant == "grouped" else None,
    )
    if variant == "early":
        opt.register_local_var(dense.kernel)  # reduced by the layer's gradient already
    model.compile(opt, "sparse_categorical_crossentropy")
    broadcast = [hvd.callbacks.BroadcastGlobalVariablesCallback(0)]
    model.fit(dataset, steps_per_epoch=WARM, epochs=1, verbose=0, callbacks=broadcast)
    span = _batch_span()
    history = model.fit(dataset, steps_per_epoch=STEPS, epochs=1, verbose=0, callbacks=[span])
    kernel = tf.constant(dense.kernel.numpy())
    drift = hvd_tf.allreduce(kernel, op=hvd_tf.Max) - hvd_tf.allreduce(kernel, op=hvd_tf.Min)
    return {
        "images_per_s": STEPS * BATCH * hvd.size() / span.seconds,
        "loss": float(history.history["loss"][-1]),
        "kernel_drift": float(np.abs(drift.numpy()).max()),
    }


def _batches(tf, rank: int):
    rng = np.random.default_rng(rank)
    images = rng.random((BATCH * 8, 28, 28, 1), dtype=np.float32)
    labels = rng.integers(0, 10, BATCH * 8)
    dataset = tf.data.Dataset.from_tensor_slices((images, labels)).repeat().batch(BATCH)
    return without_autotuning(dataset.prefetch(4))


def _batch_span():
    import tensorflow as tf

    class BatchSpan(tf.keras.callbacks.Callback):
        """Seconds from the first batch's start to the last batch's end."""

        first = last = None

        def on_train_batch_begin(self, batch, logs=None):
            self.first = self.first or time.perf_counter()

        def on_train_batch_end(self, batch, logs=None):
            self.last = time.perf_counter()

        @property
        def seconds(self) -> float:
            return self.last - self.first

    return BatchSpan()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--variants", default="base,early", help=f"of {', '.join(VARIANTS)}")
    parser.add_argument("--rounds", type=int, default=2, help="order reversed every round")
    args = parser.parse_args(argv)
    variants = args.variants.split(",")
    unknown = sorted(set(variants) - set(VARIANTS))
    if unknown:
        parser.error(f"unknown variants {unknown}: expected some of {', '.join(VARIANTS)}")

    runs: dict[str, list[dict]] = {}
    for round_ in range(args.rounds):
        for variant in variants if round_ % 2 == 0 else variants[::-1]:
            result = HorovodRunner(np=-2).run(train_variant, variant=variant)
            runs.setdefault(variant, []).append(result)
            print(json.dumps({"round": round_ + 1, "variant": variant, **result}), flush=True)
    for variant, results in runs.items():
        mean = sum(r["images_per_s"] for r in results) / len(results)
        print(f"{variant}: {mean:.1f} images/s (mean of {len(results)})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
