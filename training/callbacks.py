"""Keras callbacks for ranks launched by HorovodRunner."""

from __future__ import annotations

import time

import tensorflow as tf

from infra.launcher.rank_events import log_to_driver
from training.epoch_log import epoch_done_line, epoch_started_line, format_metrics


class LogCallback(tf.keras.callbacks.Callback):
    """Reports each epoch's progress to the driver through ``log_to_driver`` (rank 0 only).

    The lines are ``training.epoch_log``'s, so the paper's epoch-time method reads them.
    """

    def __init__(self, rank: int = 0, per_batch: bool = False):
        super().__init__()
        self.rank = rank
        self.per_batch = per_batch
        self._epoch_started = 0.0
        self._epochs = None

    def on_train_begin(self, logs=None):
        self._epochs = self.params.get("epochs")

    def on_epoch_begin(self, epoch, logs=None):
        self._epoch_started = time.perf_counter()
        if self.rank == 0:
            log_to_driver(epoch_started_line(epoch + 1, self._epochs))

    def on_train_batch_end(self, batch, logs=None):
        if self.per_batch and self.rank == 0:
            log_to_driver(f"batch {batch}: {format_metrics(logs)}")

    def on_epoch_end(self, epoch, logs=None):
        if self.rank == 0:
            took = time.perf_counter() - self._epoch_started
            log_to_driver(epoch_done_line(epoch + 1, self._epochs, took, logs))


class EpochTimer(tf.keras.callbacks.Callback):
    """Wall-clock seconds of every epoch, measured in the rank (the callback method)."""

    def __init__(self):
        super().__init__()
        self.epoch_times: list[float] = []
        self._started = 0.0

    def on_epoch_begin(self, epoch, logs=None):
        self._started = time.perf_counter()

    def on_epoch_end(self, epoch, logs=None):
        self.epoch_times.append(time.perf_counter() - self._started)
        if logs is not None:
            logs["epoch_time_s"] = self.epoch_times[-1]


class MlflowEpochMetrics(tf.keras.callbacks.Callback):
    """Logs every epoch's metrics to an MLflow run with ``step=epoch`` (use on rank 0 only).

    MLflow's TensorFlow autolog supports TF 2.16+ only, hence this callback. Put it after
    EpochTimer so that ``epoch_time_s`` is among the logs.
    """

    def __init__(self, run_id: str):
        super().__init__()
        self.run_id = run_id

    def on_epoch_end(self, epoch, logs=None):
        from mlflow import MlflowClient
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        metrics = [Metric(k, float(v), now, epoch) for k, v in sorted((logs or {}).items())]
        if metrics:
            MlflowClient().log_batch(self.run_id, metrics=metrics)
