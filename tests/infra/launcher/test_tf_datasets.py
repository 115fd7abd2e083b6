"""The strategy's own per-device datasets run without tf.data's autotuning thread."""

import types

import pytest

from hvdflow.infra.launcher._engines import device_datasets_without_autotuning


@pytest.mark.unit
def test_the_strategys_per_device_datasets_run_without_autotuning_and_still_serve_every_batch():
    import tensorflow as tf
    from tensorflow.python.data.ops import multi_device_iterator_ops as devices

    device_datasets_without_autotuning()
    wrapped = devices._create_device_dataset
    device_datasets_without_autotuning()  # once per process, however often an engine starts
    assert devices._create_device_dataset is wrapped

    # What MultiWorkerMirroredStrategy's iterator builds for each device (TF 2.15's private API:
    # this test fails first if a TensorFlow upgrade moves it).
    iterator = devices.MultiDeviceIterator(tf.data.Dataset.range(8).batch(2), ["/cpu:0"])
    device_dataset = devices._create_device_dataset(
        iterator._prototype_device_datasets[0], iterator._incarnation_id, 1, False
    )
    assert device_dataset.options().autotune.enabled is False
    assert device_dataset.options().experimental_optimization.apply_default_optimizations is False
    assert [int(iterator.get_next()[0][0]) for _ in range(4)] == [0, 2, 4, 6]


@pytest.mark.unit
def test_a_dataset_a_strategy_distributes_runs_without_autotuning_unless_its_options_say():
    import tensorflow as tf

    from hvdflow.infra.launcher._engines import wrap_distributed_datasets

    class StrategyBase:  # TensorFlow's, as far as the wrapper sees it
        def experimental_distribute_dataset(self, dataset, options=None):
            return dataset, options

    strategies = types.SimpleNamespace(StrategyBase=StrategyBase)
    wrap_distributed_datasets(strategies)
    wrapped = StrategyBase.experimental_distribute_dataset
    wrap_distributed_datasets(strategies)  # once per process
    assert StrategyBase.experimental_distribute_dataset is wrapped

    # TensorFlow's default (autotuning unset): the iterator fit deletes each epoch would wait.
    dataset, options = StrategyBase().experimental_distribute_dataset(tf.data.Dataset.range(6), 7)
    assert dataset.options().autotune.enabled is False and options == 7
    assert list(dataset.as_numpy_iterator()) == list(range(6))
    # A user who chose autotuning keeps it.
    chosen = tf.data.Options()
    chosen.autotune.enabled = True
    mine = tf.data.Dataset.range(6).with_options(chosen)
    assert StrategyBase().experimental_distribute_dataset(mine)[0] is mine
