"""The strategy's own per-device datasets run without tf.data's autotuning thread."""

import pytest

from hvdflow.infra.launcher.tf_datasets import device_datasets_without_autotuning


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
