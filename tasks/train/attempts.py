"""A training's attempts: the training function on HorovodRunner, run again from the last
checkpoint after a transient failure (the object store unreachable: after a pause).

Elastic (``launcher.min_np``): when a lost host leaves fewer than np task slots, the next
attempt runs on those left if at least min_np, and on np again once they are back; the trainer
takes the number of ranks from the engine, so shards and learning-rate scaling follow.
"""

from __future__ import annotations

import logging
import os
import time

from hvdflow.infra import HorovodRunner
from hvdflow.infra.launcher import RankFailed, SparkJobFailed
from hvdflow.infra.launcher._driver import refused_for_slots, task_gpu_amount, task_slots
from hvdflow.infra.launcher._wire import CAUSE_UNAVAILABLE
from hvdflow.infra.launcher.errors import headline
from hvdflow.tasks.config import LauncherParams
from hvdflow.tasks.train.tags import ATTEMPTS_TAG
from hvdflow.training.epoch_log import epoch_times_by_number
from hvdflow.training.frameworks import framework
from hvdflow.training.result import RankResult
from hvdflow.training.spec import TrainSpec

logger = logging.getLogger(__name__)

# How long Spark takes to drop a lost host's executor from the slots it counts.
SLOTS_NOTICE_S = 3.0
# After a rank found a service unreachable, the next attempt waits this long times the attempts
# failed so far, rather than meet the same outage at once.
UNAVAILABLE_BACKOFF_S = 15.0


class TooFewSlots(RuntimeError):
    """An elastic training lost more task slots than ``launcher.min_np`` allows."""


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

    def until_done(self, spec: TrainSpec, log_artifacts) -> RankResult:
        """Rank 0's result of the attempt that succeeded."""
        import mlflow

        launcher = self.launcher
        np = launcher.np
        while True:
            self.count += 1
            mlflow.set_tag(ATTEMPTS_TAG, str(self.number))
            if launcher.min_np is not None:  # elastic: what each attempt really ran on
                mlflow.log_param(f"attempt_{self.number}_np", np)
            lines: list = []
            self._lines.append(lines)
            options = launcher.launch_options(
                spark=self.spark,
                engine=spec.engine,
                # Each attempt's log of its own: a retry must not append to the one that failed.
                log_dir=os.path.join(self.log_dir, f"attempt-{self.number}")
                if self.log_dir
                else None,
                on_log_line=_tee(lines.append, self.on_log_line),
            )
            runner = HorovodRunner(np=np, options=options)
            started = time.perf_counter()
            try:
                return runner.run(training_function(spec), spec=spec)
            except Exception as e:
                if not may_retry(e, self.count, launcher.retries):
                    raise
                logger.warning(
                    "training attempt %d of %d failed (%s); running it again from the last "
                    "checkpoint (launcher.retries=%d)",
                    self.count,
                    launcher.retries + 1,
                    headline(e),
                    launcher.retries,
                )
                if launcher.min_np is not None:
                    np = self._ranks_for_next_attempt(headline(e), np)
                if getattr(e, "cause", None) == CAUSE_UNAVAILABLE:
                    pause = UNAVAILABLE_BACKOFF_S * self.count
                    logger.warning(
                        "a service the ranks need was unreachable: attempt %d waits %g s for it "
                        "to come back",
                        self.number + 1,
                        pause,
                    )
                    time.sleep(pause)
            finally:
                self.last_wall_s = time.perf_counter() - started
                log_artifacts(runner, self.number)

    def _ranks_for_next_attempt(self, failure: str, tried: int) -> int:
        from hvdflow.infra.spark import get_spark  # noqa: PLC0415 (lazy: it loads Spark)

        spark = self.spark or get_spark()
        # HorovodRunner runs one rank per GPU: a task slot of k GPUs holds k ranks.
        gpus = task_gpu_amount(spark.conf, "gpu")
        ranks_per_slot = int(gpus) if gpus is not None and gpus > 1 else 1

        def ranks_that_fit() -> int:
            slots = task_slots(spark)  # None: not countable (Spark Connect)
            if slots is None:
                return uncounted_ranks(self.launcher.np, tried, failure)
            return slots * ranks_per_slot

        time.sleep(SLOTS_NOTICE_S)
        np = ranks_for_next_attempt(
            self.launcher,
            ranks_that_fit,
            failure,
            settle_s=self.launcher.elastic_wait_s,
        )
        if np != self.launcher.np:
            logger.warning(
                "elastic training: %d of np=%d task slots are left after the failure; attempt "
                "%d runs on %d rank(s) from the last checkpoint (launcher.min_np=%d)",
                np,
                self.launcher.np,
                self.number + 1,
                np,
                self.launcher.min_np,
            )
        return np

    def epoch_times_log(self) -> dict[int, float]:
        """The paper's epoch times by epoch number, from every attempt; a later one wins."""
        times: dict[int, float] = {}
        for lines in self._lines:
            times.update(epoch_times_by_number(lines))
        return times


def ranks_for_next_attempt(
    launcher: LauncherParams,
    count_slots,
    failure: str,
    settle_s: float,
    sleep=time.sleep,
) -> int:
    """The ranks of the attempt after ``failure`` (its first line): np when np task slots are
    (back) within ``settle_s``; else the slots left, if at least ``launcher.min_np``; else
    TooFewSlots."""
    deadline = time.monotonic() + settle_s
    while (slots := count_slots()) < launcher.np and time.monotonic() < deadline:
        sleep(0.5)
    if slots >= launcher.np:
        return launcher.np
    if slots >= launcher.fewest_ranks:
        return slots
    raise TooFewSlots(
        f"{failure}; {slots} task slot(s) are left after waiting {settle_s:g} s "
        f"(launcher.elastic_wait_s), fewer than launcher.min_np={launcher.fewest_ranks} "
        f"(np={launcher.np}): add executors, or lower launcher.min_np to go on with fewer ranks"
    )


def uncounted_ranks(np: int, tried: int, failure: str) -> int:
    """The ranks that fit where task slots cannot be counted (Spark Connect): one fewer than
    ``tried`` when Spark's barrier check refused ``failure``'s attempt for want of slots, else
    ``np``; asking np again would be refused until the retries ran out."""
    return tried - 1 if refused_for_slots(failure) else np


def may_retry(error: BaseException, attempt: int, retries: int) -> bool:
    """Whether a training that failed with ``error`` in attempt ``attempt`` (from 1) runs again:
    only transient failures (a rank killed, a host or executor lost, a stall, the object store
    unreachable); another error would only fail the same way again."""
    if attempt > retries:
        return False
    return isinstance(error, (RankFailed, SparkJobFailed)) and error.transient


def _tee(*consumers):
    consumers = [c for c in consumers if c is not None]

    def consume(line):
        for consumer in consumers:
            consumer(line)

    return consume


def training_function(spec: TrainSpec):
    """The function every rank runs: the Keras trainer, or the PyTorch one."""
    return framework(spec.framework).training_function()
