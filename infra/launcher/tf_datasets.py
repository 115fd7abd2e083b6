"""Datasets a strategy distributes, without tf.data's autotuning thread where the user left it on.

The strategy serves each worker's dataset through datasets it builds itself, one per device
(``MultiDeviceIterator``), with tf.data's default options: autotuning on. Their iterator is
deleted at the end of ``model.fit``, and the deletion waits for the autotuning thread to wake,
which sleeps for a period that doubles over the run, up to a minute: workers sat idle 12-28 s
after their last epoch here, every run of a user's function paying it by chance
(BENCHMARKS.md). Those datasets are the strategy's, never the user's (a generator over the
worker's own pipeline, and a prefetch: nothing to tune), so every tf_collective rank builds them
without autotuning (``_rank``), and so does the pipeline's TF engine (``training.engines``).
TF 2.15 has no option that reaches them: their builder is wrapped.

The user's own dataset pays the same wait whenever its iterator is deleted: ``model.fit`` over a
dataset without ``.repeat()`` makes a new iterator each epoch and deletes the last one, and the
deletion waits for that iterator's autotuning thread, up to the length of the epoch (measured
with a user's function in BENCHMARKS.md). So in every rank that runs TensorFlow (tf_collective
and Horovod: Keras' fit hands a dataset to the default strategy too), a dataset that a strategy
distributes, whose options leave autotuning unset (TensorFlow's default), is distributed without
it; a dataset whose options set ``autotune.enabled`` keeps what they say.
"""

from __future__ import annotations

# Where TensorFlow builds the per-device datasets (TF 2.15's private API: the unit test fails
# first if a TensorFlow upgrade moves it).
DEVICE_DATASETS_MODULE = "tensorflow.python.data.ops.multi_device_iterator_ops"
_MARK = "hvdflow_without_autotuning"
# Where strategies take a user's dataset (``experimental_distribute_dataset``; Keras' fit calls it).
STRATEGIES_MODULE = "tensorflow.python.distribute.distribute_lib"


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


def wrap_distributed_datasets(strategies) -> None:
    """Wrap ``StrategyBase.experimental_distribute_dataset`` (``strategies``: the module)."""
    base = strategies.StrategyBase
    distribute = base.experimental_distribute_dataset
    if getattr(distribute, _MARK, False):
        return

    def distribute_without_autotuning(self, dataset, options=None):
        return distribute(self, without_default_autotuning(dataset), options)

    setattr(distribute_without_autotuning, _MARK, True)
    distribute_without_autotuning.__doc__ = distribute.__doc__
    base.experimental_distribute_dataset = distribute_without_autotuning


def without_default_autotuning(dataset):
    """``dataset`` without autotuning when its options leave it unset; otherwise as it is."""
    import tensorflow as tf  # noqa: PLC0415 (loaded by now: a strategy is distributing)

    if not isinstance(dataset, tf.data.Dataset) or dataset.options().autotune.enabled is not None:
        return dataset
    options = tf.data.Options()
    options.autotune.enabled = False
    return dataset.with_options(options)


def device_datasets_without_autotuning() -> None:
    """Wrap the builder in this process now (loads TensorFlow)."""
    import importlib  # noqa: PLC0415

    wrap_device_datasets(importlib.import_module(DEVICE_DATASETS_MODULE))
