"""MultiWorkerMirroredStrategy's own per-device datasets, without tf.data's autotuning thread.

The strategy serves each worker's dataset through datasets it builds itself, one per device
(``MultiDeviceIterator``), with tf.data's default options: autotuning on. Their iterator is
deleted at the end of ``model.fit``, and the deletion waits for the autotuning thread to wake,
which sleeps for a period that doubles over the run, up to a minute: workers sat idle 12-28 s
after their last epoch here, every run of a user's function paying it by chance
(BENCHMARKS.md). Those datasets are the strategy's, never the user's (a generator over the
worker's own pipeline, and a prefetch: nothing to tune), so every tf_collective rank builds them
without autotuning (``_rank``), and so does the pipeline's TF engine (``training.engines``).
TF 2.15 has no option that reaches them: their builder is wrapped.
"""

from __future__ import annotations

# Where TensorFlow builds the per-device datasets (TF 2.15's private API: the unit test fails
# first if a TensorFlow upgrade moves it).
DEVICE_DATASETS_MODULE = "tensorflow.python.data.ops.multi_device_iterator_ops"
_MARK = "hvdflow_without_autotuning"


def wrap_device_datasets(devices) -> None:
    """Wrap ``devices._create_device_dataset`` (``devices``: the module); once per process."""
    build = devices._create_device_dataset
    if getattr(build, _MARK, False):
        return

    def build_without_autotuning(*args, **kwargs):
        import tensorflow as tf  # noqa: PLC0415 (loaded by now: this runs inside the strategy)

        options = tf.data.Options()
        options.autotune.enabled = False
        # Nothing there to optimise; trying says so in a warning at every iterator.
        options.experimental_optimization.apply_default_optimizations = False
        return build(*args, **kwargs).with_options(options)

    setattr(build_without_autotuning, _MARK, True)
    devices._create_device_dataset = build_without_autotuning


def device_datasets_without_autotuning() -> None:
    """Wrap the builder in this process now (loads TensorFlow)."""
    import importlib  # noqa: PLC0415

    wrap_device_datasets(importlib.import_module(DEVICE_DATASETS_MODULE))
