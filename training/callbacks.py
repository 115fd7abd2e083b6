"""Keras callbacks for ranks launched by HorovodRunner."""

from __future__ import annotations

import collections
import threading
import time

import tensorflow as tf

from hvdflow.infra.launcher import log_to_driver, report_progress
from hvdflow.training.checkpoints import CheckpointState, epoch_folder
from hvdflow.training.epoch_log import (
    INPUT_WAIT_WARN,
    epoch_done_line,
    epoch_started_line,
    format_metrics,
    input_wait_warning,
)
from hvdflow.training.metrics_sender import EpochMetricsSender
from hvdflow.training.quality import divergence


class LogCallback(tf.keras.callbacks.Callback):
    """Reports each epoch's progress to the driver (rank 0 only), in ``epoch_log``'s lines."""

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


class InputWait(tf.keras.callbacks.Callback):
    """The share of each epoch's step time spent waiting for the batch, as ``input_wait_share``
    in its logs (the epoch line, MLflow): 1 minus MLPerf Storage's accelerator utilisation, the
    run's first step (the reader's start) left out as there. ``watch(dataset)`` notes when each
    batch is ready, in a stage ahead of a prefetch: a step waited from its start until then."""

    def __init__(self, rank: int = 0):
        super().__init__()
        self.rank, self._warned, self._first, self._ready = rank, False, True, collections.deque()
        self._began = self._waited = self._stepped = 0.0

    def watch(self, dataset):
        def ready():
            self._ready.append(time.perf_counter())

        def noted(*batch):
            with tf.control_dependencies([tf.py_function(ready, [], [])]):
                return tf.nest.map_structure(tf.identity, batch)

        return dataset.map(tf.autograph.experimental.do_not_convert(noted)).prefetch(1)

    def on_epoch_begin(self, epoch, logs=None):
        self._waited = self._stepped = 0.0

    def on_train_batch_begin(self, batch, logs=None):
        self._began = time.perf_counter()

    def on_train_batch_end(self, batch, logs=None):
        ready = self._ready.popleft() if self._ready else self._began  # each batch once, in order
        if not self._first:
            self._waited += max(0.0, ready - self._began)
            self._stepped += time.perf_counter() - self._began
        self._first = False

    def on_epoch_end(self, epoch, logs=None):
        if logs is not None and self._stepped:
            logs["input_wait_share"] = share = self._waited / self._stepped
            if share > INPUT_WAIT_WARN and not self._warned:
                self._warned = True
                log_to_driver(input_wait_warning(share, epoch + 1, self.rank))


class LearningRateLog(tf.keras.callbacks.Callback):
    """Puts the learning rate an epoch ended with into its logs, so the warm-up shows in MLflow
    and the epoch lines; ``plan``: a ``LearningRatePlan``, read at the optimizer's step count."""

    def __init__(self, plan):
        super().__init__()
        self.plan = plan

    def on_epoch_end(self, epoch, logs=None):
        if logs is not None:
            steps = int(tf.keras.backend.get_value(self.model.optimizer.iterations))
            logs["learning_rate"] = self.plan.at_step(max(steps - 1, 0))


class DivergenceGuard(tf.keras.callbacks.Callback):
    """Stops training at the end of an epoch whose loss diverged (``hvdflow.training.quality``).

    Epoch ends only, after the engine's callbacks: there every rank reads the same metrics, so
    all stop together; a rank stopping alone would leave the others waiting in an allreduce.
    """

    def __init__(self, num_classes: int, learning_rate: str = "", rank: int = 0):
        super().__init__()
        self.num_classes = num_classes
        self.learning_rate = learning_rate
        self.rank = rank
        self.reason: str | None = None

    def on_epoch_end(self, epoch, logs=None):
        reason = divergence(epoch + 1, logs or {}, self.num_classes, self.learning_rate)
        if reason is not None:
            self.reason = reason
            self.model.stop_training = True
            if self.rank == 0:
                log_to_driver(f"stopping: {reason}")


class MlflowEpochMetrics(tf.keras.callbacks.Callback):
    """Logs every epoch's metrics to an MLflow run with ``step=epoch`` (rank 0 only; after
    EpochTimer). MLflow's TensorFlow autolog supports TF 2.16+ only, hence this callback.

    Best effort (``EpochMetricsSender``): a tracking server that is down costs no epoch; training's
    end waits up to ``flush_s``, and the driver backfills what is still unsent.
    """

    def __init__(self, run_id: str, flush_s: float = 60.0, retry_s: float = 5.0):
        super().__init__()
        self.run_id = run_id
        self.flush_s = flush_s
        self._sender = EpochMetricsSender(run_id, retry_s=retry_s)

    def on_epoch_end(self, epoch, logs=None):
        self._sender.put(epoch, {k: float(v) for k, v in (logs or {}).items()})

    def log_evaluation(self, step: int, images: int, accuracy: float) -> None:
        """An interval evaluation at optimizer step ``step``, for the accuracy-over-time chart."""
        metrics = {"interval_val_accuracy": accuracy, "interval_images_trained": float(images)}
        self._sender.put(step, metrics, kind="evaluation")

    def on_train_end(self, logs=None):
        self._sender.close(self.flush_s)


class ProfileCallback(tf.keras.callbacks.Callback):
    """TensorFlow's profiler over batches ``[start, stop)`` of the whole training (Keras'
    ``profile_batch`` without its summaries): an ``.xplane.pb`` under ``log_dir``."""

    def __init__(self, log_dir: str, start: int, stop: int):
        super().__init__()
        if not 0 <= start < stop:
            raise ValueError(f"profile_batches ({start}, {stop}): expected 0 <= start < stop")
        self.log_dir, self.start, self.stop = log_dir, start, stop
        self._batch = 0
        self._running = False

    def on_train_batch_begin(self, batch, logs=None):
        if self._batch == self.start:
            tf.profiler.experimental.start(self.log_dir)
            self._running = True

    def on_train_batch_end(self, batch, logs=None):
        self._batch += 1
        if self._batch == self.stop:
            self._finish()

    def on_train_end(self, logs=None):
        self._finish()

    def _finish(self) -> None:
        if self._running:
            self._running = False
            tf.profiler.experimental.stop()


class ProgressCallback(tf.keras.callbacks.Callback):
    """Feeds HorovodRunner's stall watch (``stall_timeout_s``) on every rank: the batch hooks
    only count, and a thread reports the counts twice a second when they changed."""

    def __init__(self, every_s: float = 0.5):
        super().__init__()
        self.every_s = every_s
        self.begun = self.finished = 0
        self._stop = None

    def on_train_begin(self, logs=None):
        self._stop = threading.Event()
        report_progress(self.begun, self.finished, watch=True)
        threading.Thread(target=self._report, daemon=True, name="hvdflow-progress").start()

    def _report(self) -> None:
        last = None
        while not self._stop.wait(self.every_s):
            now = (self.begun, self.finished)
            if now != last:
                report_progress(*now, watch=True)
                last = now

    def on_train_batch_begin(self, batch, logs=None):
        self.begun += 1

    def on_train_batch_end(self, batch, logs=None):
        self.finished += 1

    def on_test_batch_begin(self, batch, logs=None):
        self.begun += 1

    def on_test_batch_end(self, batch, logs=None):
        self.finished += 1

    def on_train_end(self, logs=None):
        self._stop.set()
        report_progress(self.begun, self.finished, watch=False)


class CheckpointCallback(tf.keras.callbacks.Callback):
    """Rank 0 writes a checkpoint at the end of every epoch (``hvdflow.training.checkpoints``).

    ``state``: the checkpoint resumed from (or None), whose history carries on. After EpochTimer
    and MetricAverageCallback (final logs), before MlflowEpochMetrics (a retry never logs an
    epoch twice).
    """

    def __init__(self, store, checkpoint, state=None):
        super().__init__()
        self.store = store
        self.checkpoint = checkpoint
        self.history: dict[str, list[float]] = {
            k: list(v) for k, v in (state.history if state else {}).items()
        }
        self.epoch_times: list[float] = list(state.epoch_times) if state else []

    def on_epoch_end(self, epoch, logs=None):
        for key, value in (logs or {}).items():
            self.history.setdefault(key, []).append(float(value))
        self.epoch_times.append(float((logs or {}).get("epoch_time_s", 0.0)))
        state = CheckpointState(
            epoch=epoch + 1,
            folder=epoch_folder(epoch + 1),
            history=self.history,
            epoch_times=self.epoch_times,
        )
        started = time.perf_counter()
        self.store.save(self.checkpoint, state)
        log_to_driver(
            f"checkpoint of epoch {epoch + 1} written to {self.store.url}/{state.folder} in "
            f"{time.perf_counter() - started:.1f} s"
        )
