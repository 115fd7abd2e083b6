"""Evaluation every few steps on a fixed validation subset: time to accuracy finer than an epoch.

Keras evaluates at epoch ends only, so a time to accuracy read from its logs jumps by a whole
epoch. MLPerf Training evaluates at fixed intervals of samples, counting the evaluations' time in
the time to train; so does this.

The subset is the same images whatever the ranks (``subset_rows``, seeded); rank r of n evaluates
every n-th of them, the counts are summed over ranks, and rank 0 logs the accuracy. The interval
is a fraction of an epoch, so every condition of a study pays the same share for evaluating.
"""

from __future__ import annotations

import time

import numpy as np
import tensorflow as tf

from hvdflow.infra.launcher import log_to_driver
from hvdflow.training.epoch_log import evaluation_line
from hvdflow.training.reader import normalized_batch

EVAL_BATCH = 256


def subset_rows(val_rows: int, images: int, seed: int) -> np.ndarray:
    """Indices of ``images`` rows (all of them, if fewer) of a split of ``val_rows``, sorted:
    the same for the same seed, whatever the ranks."""
    if images >= val_rows:
        return np.arange(val_rows)
    return np.sort(np.random.default_rng(seed).permutation(val_rows)[:images])


def eval_interval_steps(steps_per_epoch: int, every_epochs: float) -> int:
    """Optimizer steps between two evaluations: ``every_epochs`` of an epoch, at least one."""
    return max(1, round(steps_per_epoch * every_epochs))


def evaluates_after(step_in_epoch: int, every_steps: int, steps_per_epoch: int) -> bool:
    """Whether the evaluation follows this step (from 1 in its epoch): every ``every_steps``,
    and after the epoch's last step, so the intervals do not drift from the epochs."""
    return step_in_epoch % every_steps == 0 or step_in_epoch == steps_per_epoch


class IntervalEvaluation(tf.keras.callbacks.Callback):
    """Evaluates ``images`` (this rank's part of the subset, uint8) on every rank when
    ``evaluates_after`` says. ``images_per_step`` is the global batch. Steps count from the
    optimizer's own counter, so a resumed training goes on from the checkpoint's."""

    def __init__(
        self,
        engine,
        images: np.ndarray,
        labels: np.ndarray,
        every_steps: int,
        steps_per_epoch: int,
        images_per_step: int,
        on_evaluation=None,
    ):
        super().__init__()
        self.on_evaluation = on_evaluation  # rank 0's (step, images trained, accuracy) sink
        self.engine = engine
        self.images = images
        self.labels = labels.astype(np.int64)
        self.every_steps = every_steps
        self.steps_per_epoch = steps_per_epoch
        self.images_per_step = images_per_step
        self.step = 0  # optimizer steps, over the whole training
        self.accuracies: list[tuple[int, float]] = []  # (step, accuracy)
        self._in_epoch = 0
        self._predict = None

    def on_train_begin(self, logs=None):
        optimizer = getattr(self.model, "optimizer", None)
        if optimizer is not None:
            self.step = int(tf.keras.backend.get_value(optimizer.iterations))

    def on_epoch_begin(self, epoch, logs=None):
        self._in_epoch = 0

    def on_train_batch_end(self, batch, logs=None):
        self.step += 1
        self._in_epoch += 1
        if evaluates_after(self._in_epoch, self.every_steps, self.steps_per_epoch):
            self.evaluate()

    def evaluate(self) -> float:
        started = time.perf_counter()
        correct = self._correct()
        correct, seen = self.engine.sum_over_ranks([correct, float(len(self.labels))])
        accuracy = correct / max(seen, 1.0)
        self.accuracies.append((self.step, accuracy))
        if self.engine.rank == 0:
            log_to_driver(
                evaluation_line(
                    self.step,
                    self.step * self.images_per_step,
                    accuracy,
                    int(seen),
                    time.perf_counter() - started,
                )
            )
            if self.on_evaluation is not None:
                self.on_evaluation(self.step, self.step * self.images_per_step, accuracy)
        return accuracy

    def _correct(self) -> float:
        if self._predict is None:
            model = self.model

            @tf.function(reduce_retracing=True)
            def predict(batch):
                images, _ = normalized_batch(batch, tf.zeros([0], tf.int32))  # as trained
                return tf.argmax(model(images, training=False), axis=-1)

            self._predict = predict
        correct = 0
        for start in range(0, len(self.labels), EVAL_BATCH):
            predicted = self._predict(self.images[start : start + EVAL_BATCH]).numpy()
            correct += int(np.sum(predicted == self.labels[start : start + EVAL_BATCH]))
        return float(correct)
