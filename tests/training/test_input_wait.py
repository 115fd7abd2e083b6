"""Every epoch says what share of its step time the rank waited for its input
(``input_wait_share``), and a rank that waits too long is told once what to change.

A real Keras ``fit``, as the trainer runs it, of a step of about 10 ms on two readers: one that
takes 100 ms for each batch (a storage that answers slowly), one that serves a batch already in
memory. The trainers'
own runs log the share to MLflow every epoch (tests/tasks/train/test_run.py, the torch trainer's
test).
"""

from __future__ import annotations

import logging
import time

import numpy as np
import pytest

from hvdflow.training.epoch_log import INPUT_WAIT_WARN

pytestmark = pytest.mark.integration

WARNING = "waited for its input"


def fit(dataset, epochs: int = 3) -> list[float]:
    import tensorflow as tf

    from hvdflow.training.callbacks import InputWait

    model = tf.keras.Sequential(
        [
            tf.keras.layers.Input((256,)),
            tf.keras.layers.Dense(1024, activation="relu"),
            tf.keras.layers.Dense(10),
        ]
    )
    model.compile("sgd", tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    waits = InputWait()
    history = model.fit(
        waits.watch(dataset.prefetch(2)), steps_per_epoch=10, epochs=epochs, callbacks=[waits]
    )
    return history.history["input_wait_share"]


def batches(delay_s: float):
    import tensorflow as tf

    def read():
        rng = np.random.default_rng(0)
        while True:
            time.sleep(delay_s)  # what the storage takes to answer
            yield rng.random((512, 256), dtype=np.float32), rng.integers(0, 10, 512)

    spec = (tf.TensorSpec((None, 256), tf.float32), tf.TensorSpec((None,), tf.int64))
    return tf.data.Dataset.from_generator(read, output_signature=spec)


def test_a_step_waiting_for_a_slow_reader_says_so_once_and_one_fed_from_memory_does_not(caplog):
    import tensorflow as tf

    caplog.set_level(logging.INFO)
    slow = fit(batches(0.1))
    assert len(slow) == 3 and min(slow) > 0.7, slow  # the step takes about 10 ms, the read 100
    warned = [r.getMessage() for r in caplog.records if WARNING in r.getMessage()]
    assert len(warned) == 1, warned  # once, not every epoch
    assert warned[0].startswith(f"rank 0 {WARNING} ")
    assert "data.image_encoding='raw'" in warned[0] and "in_memory_max_mb" in warned[0]

    caplog.clear()
    held = tf.data.Dataset.from_tensors(next(iter(batches(0.0)))).repeat()
    fast = fit(held)
    assert len(fast) == 3 and max(fast) < INPUT_WAIT_WARN, (fast, slow)
    assert not [r for r in caplog.records if WARNING in r.getMessage()]
