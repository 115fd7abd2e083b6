"""Evaluation every few steps on a fixed validation subset: time to accuracy finer than an epoch.

Keras evaluates at epoch ends only, so a time to a target accuracy read from its logs jumps by a
whole epoch on which side of the target one evaluation falls (docs/benchmarks/training.md,
"Time to accuracy"). MLPerf Training evaluates at fixed intervals of samples instead, and
counts the evaluations' time in the time to train; so does this.

The subset is the same images whatever the number of ranks: ``subset_rows`` picks them from the
whole validation split with the training seed, and rank r of n evaluates every n-th of them, so
each rank's evaluation costs its share (1/n), as its training does; the ranks' counts are summed
(``Engine.sum_over_ranks``) and rank 0 logs the accuracy (``epoch_log.evaluation_line``, and to
the MLflow run at the optimizer step: ``MlflowEpochMetrics.log_evaluation``). The
interval is a fraction of an epoch, that is a number of images trained whatever the global batch,
so that every condition of a study pays the same share of its time for evaluating.
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
    """Whether the evaluation follows this step (counted from 1 in its epoch): every
    ``every_steps`` from the epoch's start, and after its last step, so that the training's
    end is always evaluated and the intervals do not drift from the epochs."""
    return step_in_epoch % every_steps == 0 or step_in_epoch == steps_per_epoch


class IntervalEvaluation(tf.keras.callbacks.Callback):
    """Evaluates ``images`` (this rank's part of the subset, uint8, and their labels) every
    ``every_steps`` optimizer steps of an epoch and after its last (``evaluates_after``); put it
    on every rank. ``images_per_step`` is the global batch. Steps count from the optimizer's
    own counter, so a resumed training goes on from the checkpoint's."""

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
