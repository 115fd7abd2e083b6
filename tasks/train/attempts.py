"""A training's attempts: the training function on HorovodRunner, run again from the last
checkpoint after a transient failure (a rank killed, a host lost, a stall, an executor lost)."""

from __future__ import annotations

import logging
import os
import time

from hvdflow.infra import HorovodRunner
from hvdflow.infra.launcher import RankFailed, SparkJobFailed
from hvdflow.tasks.config import LauncherParams
from hvdflow.tasks.train.tags import ATTEMPTS_TAG
from hvdflow.training.epoch_log import epoch_times_by_number
from hvdflow.training.spec import TrainSpec
from hvdflow.training.trainer import train_classifier

logger = logging.getLogger(__name__)


class Attempts:
    """Runs the training function on HorovodRunner until it succeeds or may not run again."""

    def __init__(self, launcher: LauncherParams, spark, log_dir, on_log_line, before: int = 0):
        self.launcher = launcher
        self.spark = spark
        self.log_dir = log_dir
        self.on_log_line = on_log_line
        self.before = before  # attempts made for this MLflow run before (a resumed run)
        self.count = 0  # attempts made by this call
        self.last_wall_s = 0.0
        self._lines: list[list] = []  # each attempt's rank output, for the epoch-log times

    @property
    def number(self) -> int:
        """The current attempt's number in the MLflow run, from 1."""
        return self.before + self.count

    def until_done(self, spec: TrainSpec, log_artifacts) -> dict:
        import mlflow

        launcher = self.launcher
        while True:
            self.count += 1
            mlflow.set_tag(ATTEMPTS_TAG, str(self.number))
            lines: list = []
            self._lines.append(lines)
            runner = HorovodRunner(
                np=launcher.np,
                spark=self.spark,
                horovod=launcher.horovod,
                start_timeout_s=launcher.start_timeout_s,
                heartbeat_timeout_s=launcher.heartbeat_timeout_s,
                stall_timeout_s=launcher.stall_timeout_s,
                engine=launcher.engine,
                # Each attempt's log of its own: a retry must not append to the one that failed.
                log_dir=os.path.join(self.log_dir, f"attempt-{self.number}")
                if self.log_dir
                else None,
                on_log_line=_tee(lines.append, self.on_log_line),
            )
            started = time.perf_counter()
            try:
                return runner.run(train_classifier, spec=spec)
            except Exception as e:
                if not may_retry(e, self.count, launcher.retries):
                    raise
                logger.warning(
                    "training attempt %d of %d failed (%s); running it again from the last "
                    "checkpoint (launcher.retries=%d)",
                    self.count,
                    launcher.retries + 1,
                    str(e).splitlines()[0],
                    launcher.retries,
                )
            finally:
                self.last_wall_s = time.perf_counter() - started
                log_artifacts(runner, self.number)

    def epoch_times_log(self) -> dict[int, float]:
        """The paper's epoch times by epoch number, from every attempt; a later one wins."""
        times: dict[int, float] = {}
        for lines in self._lines:
            times.update(epoch_times_by_number(lines))
        return times


def may_retry(error: BaseException, attempt: int, retries: int) -> bool:
    """Whether a training that failed with ``error`` in attempt ``attempt`` (from 1) runs again.

    Only transient failures are retried: a rank killed by a signal, a host lost, a stall, or the
    Spark job itself failing (an executor lost). A Python error in the training function would
    only fail the same way again.
    """
    if attempt > retries:
        return False
    return isinstance(error, (RankFailed, SparkJobFailed)) and error.transient


def _tee(*consumers):
    consumers = [c for c in consumers if c is not None]

    def consume(line):
        for consumer in consumers:
            consumer(line)

    return consume
