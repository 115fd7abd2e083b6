"""HorovodRunner: run a training function as Horovod ranks in one Spark barrier stage.

An open counterpart of Databricks' ``sparkdl.HorovodRunner`` with the same call shape::

    from hvdflow import HorovodRunner

    def train(learning_rate):
        import horovod.tensorflow.keras as hvd
        hvd.init()
        ...
        return model.get_weights()

    weights = HorovodRunner(np=2).run(train, learning_rate=0.1)

hvdflow's own settings (the engine, Horovod's knobs, timeouts, logs) are one ``LaunchOptions``::

    HorovodRunner(np=2, options=LaunchOptions(stall_timeout_s=120))

``np > 0`` runs one barrier task per rank on the cluster; ``np < 0`` runs ``-np`` rank processes
on the driver, with no Spark tasks, for local debugging. Ranks meet over Gloo through a
rendezvous server on the driver: no MPI, no ssh.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

import cloudpickle

from hvdflow.infra import constants as c
from hvdflow.infra import extras
from hvdflow.infra.home import hvdflow_home
from hvdflow.infra.launcher import _stall, _wire
from hvdflow.infra.launcher._channel import DriverChannel
from hvdflow.infra.launcher._decisions import error_line
from hvdflow.infra.launcher._encryption import refuse_unencrypted
from hvdflow.infra.launcher._engines import engine
from hvdflow.infra.launcher._payload import pickle_payload
from hvdflow.infra.launcher._placement import GpuPlan, driver_gpu_addresses, split_evenly
from hvdflow.infra.launcher._relay import RelaySpec, relay_spec
from hvdflow.infra.launcher._runlog import RunLog
from hvdflow.infra.launcher._slots import (
    RESUBMIT_EVERY_S,
    refused_for_slots,
    task_gpu_amount,
    wait_for_slots,
)
from hvdflow.infra.launcher._spark_errors import first_line
from hvdflow.infra.launcher._stage import run_barrier_stage
from hvdflow.infra.launcher._task import TaskSpec, run_task
from hvdflow.infra.launcher.errors import (
    OUTPUT_HEADING,
    STACKS_HEADING,
    RankFailed,
    SparkJobFailed,
    rank_failed,
)
from hvdflow.infra.launcher.options import LaunchOptions, checked_options
from hvdflow.infra.storage.access import s3_endpoint

logger = logging.getLogger(__name__)

Verbosity = Literal["log_callback_only", "all"]
_VERBOSITIES = ("log_callback_only", "all")
# How long the driver waits for tasks to stop after it cancelled the run.
_STOP_GRACE_S = 30.0
# How long to gather the ranks' failure reports before naming the one that caused the others.
_SETTLE_S = 2.0
_POLL_S = 0.2
# How long a successful run waits for the tasks' connections to end (their last lines read).
_DRAIN_S = 5.0
# How long the driver waits for every rank's stacks after the run stalled.
_STACKS_WAIT_S = 5.0


@dataclass(frozen=True)
class LaunchPlan:
    """What a face (HorovodRunner, MirroredStrategyRunner, TorchDistributor) decides before the
    run, beyond np and the options: the one thing each face hands the launcher.

    ``face``: the runner the user called, as errors name it; ``size_argument``: its argument for
    the number of ranks; ``ignore_ssl_conf``: its Spark conf that allows an encrypted cluster;
    ``asked``: what errors say was asked for (default: ``np=N``); ``gpu_plan``: how GPUs are
    handed to ranks; ``layout``: how many ranks each barrier task runs (None: one per task
    slot, a task holding k GPUs running k; on the driver, all of them).
    """

    face: str = "HorovodRunner"
    size_argument: str = "np"
    ignore_ssl_conf: str = "databricks.horovod.ignoreSsl"  # Databricks' own
    asked: str | None = None
    gpu_plan: GpuPlan = field(default_factory=GpuPlan)
    layout: tuple[int, ...] | None = None


def face_options(options: LaunchOptions, plan: LaunchPlan, **fixed: Any) -> LaunchOptions:
    """A face's options: what the face fixes (``engine``, ...), on the session the options name
    or else the active (or default) one; checked now, as a HorovodRunner's are when made."""
    spark = options.spark
    if spark is None:
        from hvdflow.infra.spark import get_spark  # noqa: PLC0415 (lazy: it loads Spark)

        spark = get_spark()
    options = dataclasses.replace(options, spark=spark, **fixed)
    HorovodRunner(np=1, options=options, _plan=plan)
    return options


class HorovodRunner:
    """Runs ``main`` as ``np`` Horovod ranks and returns rank 0's return value.

    Args:
        np: number of ranks. ``np > 0``: Spark barrier tasks on the active (or default) Spark
            session, one rank per task slot, which maps to a GPU on a GPU cluster: where each
            task holds k GPUs (``spark.task.resource.gpu.amount``), ``ceil(np / k)`` tasks run
            up to k ranks each, every rank seeing one GPU. ``np < 0``: ``-np`` processes on
            the driver, without Spark, one GPU of the driver each where it has some.
        driver_log_verbosity: ``"log_callback_only"`` shows only ``log_to_driver`` messages in
            the driver's log; ``"all"`` shows every line the ranks write. Every line always
            goes to the run's log file (``log_path`` after ``run``) and to
            ``options.on_log_line``.
        options: what hvdflow adds to Databricks' two arguments (``LaunchOptions``: the engine,
            Horovod's knobs, timeouts and liveness, where the log goes, the Spark session).

    Inside ``main``, where a task runs one rank, ``pyspark.BarrierTaskContext.get()`` answers as
    in the Spark task that started it (``allGather``, ``barrier``, ``partitionId``, ...).
    """

    def __init__(
        self,
        *,
        np: int,
        driver_log_verbosity: Verbosity = "log_callback_only",
        options: LaunchOptions | None = None,
        _plan: LaunchPlan | None = None,
        **moved: Any,
    ):
        # ``_plan``: the other faces' (their own modules); a HorovodRunner's is the default.
        self._plan = _plan or LaunchPlan()
        options = checked_options(options, self._plan.face, f"np={np!r}", moved)
        if isinstance(np, bool) or not isinstance(np, int) or np == 0:
            raise ValueError(
                f"np={np!r}: expected a non-zero integer, the number of ranks (np > 0 on the "
                "Spark cluster, np < 0 for that many processes on the driver; np=0, every task "
                "slot, was deprecated by Databricks: set the number explicitly)"
            )
        if driver_log_verbosity not in _VERBOSITIES:
            raise ValueError(
                f"driver_log_verbosity={driver_log_verbosity!r}: expected one of {_VERBOSITIES}"
            )
        self.np = np
        self.driver_log_verbosity = driver_log_verbosity
        self.options = options
        self.log_path: str | None = None
        self.run_id: str | None = None

    def _name(self) -> str:
        """How errors name this run: the runner the user called and what was asked of it."""
        return f"{self._plan.face} {self._plan.asked or f'np={self.np}'}"

    @property
    def _uses_horovod(self) -> bool:
        """Whether the driver serves Horovod's rendezvous (the engine's row says)."""
        return engine(self.options.engine).rendezvous

    def run(self, main: Callable[..., Any], **kwargs: Any) -> Any:
        """Run ``main(**kwargs)`` on every rank; return what rank 0 returned."""
        payload = pickle_payload(main, kwargs)
        needs = engine(self.options.engine).extra
        if needs is not None:
            extras.require(
                needs,
                f"{self._name()} with engine={self.options.engine!r}",
                "options=LaunchOptions(engine='tf_collective') (TensorFlow's "
                "MultiWorkerMirroredStrategy)",
            )
        self.options.horovod.warn_about_costs(self.options.forwarded())
        self.run_id = uuid.uuid4().hex[:12]
        # The log outlives the run where a user looks for it (not in /tmp, which nothing cleans
        # and a reboot empties): HVDFLOW_HOME/logs/runs/<date>-<run id>/driver.log.
        log_dir = self.options.log_dir or str(
            hvdflow_home() / "logs" / "runs" / f"{time.strftime('%Y%m%d-%H%M%S')}-{self.run_id}"
        )
        os.makedirs(log_dir, exist_ok=True)
        self.log_path = os.path.join(log_dir, "driver.log")
        with RunLog(self.log_path, self.driver_log_verbosity, self.options.on_log_line) as sink:
            started = time.monotonic()
            if self.np < 0:
                result = self._run_on_driver(payload, sink)
            else:
                result = self._run_on_spark(payload, sink)
            logger.info(
                "%s finished in %.1f s (log: %s)",
                self._name(),
                time.monotonic() - started,
                self.log_path,
            )
        return cloudpickle.loads(result) if result is not None else None

    def _spec(
        self, payload: bytes, channel: DriverChannel, ranks_per_task: tuple[int, ...] | None
    ) -> TaskSpec:
        return TaskSpec(
            payload=payload,
            driver_host=channel.bind_host,
            driver_port=channel.port,
            token=channel.token,
            rendezvous_addr=channel.bind_host,
            rendezvous_port=channel.rendezvous_port,
            # Forwarded values may be secrets: they travel in the task closure, never in logs.
            options_env={**self.options.forwarded(), **self.options.horovod.to_env()},
            run_id=self.run_id,
            start_timeout_s=self.options.start_timeout_s,
            heartbeat_timeout_s=self.options.heartbeat_timeout_s,
            engine=self.options.engine,
            ranks_per_task=ranks_per_task,
            gpus_per_task=self._plan.gpu_plan.per_task,
            gpu_resource_name=self._plan.gpu_plan.resource_name,
            relay=channel.relay.spec if channel.relay is not None else None,
        )

    def _relay(self) -> RelaySpec | None:
        """The object store relay this run offers its tasks (``LaunchOptions.relay``), or None:
        never with Horovod's rendezvous on the driver, and in ``auto`` only where the
        environment names an object store."""
        mode = self.options.relay
        if mode == "never" or self._uses_horovod:
            return None
        if mode == "auto" and not (s3_endpoint() or os.environ.get(c.HVDFLOW_BUCKET)):
            return None
        return relay_spec(self.run_id, always=mode == "always")

    def _task_layout(self, conf) -> tuple[int, tuple[int, ...] | None]:
        """How many barrier tasks run the np ranks, and how many ranks each (None: one).

        One rank per GPU, as Databricks' HorovodRunner: tasks holding k GPUs run k ranks each.
        """
        gpus = task_gpu_amount(conf, self._plan.gpu_plan.resource_name)
        if self._plan.gpu_plan.per_task is not None or gpus is None or gpus <= 1:
            return self.np, None
        per_task = int(gpus)
        tasks = math.ceil(self.np / per_task)
        layout = tuple(split_evenly(self.np, tasks))
        if self.np % per_task:
            logger.warning(
                "np=%d is not a multiple of the %d GPUs each task holds "
                "(spark.task.resource.%s.amount): %d tasks run %s ranks, leaving GPUs idle",
                self.np,
                per_task,
                self._plan.gpu_plan.resource_name,
                tasks,
                "/".join(map(str, layout)),
            )
        return tasks, layout

    def _run_on_spark(self, payload: bytes, sink: RunLog) -> bytes | None:
        from hvdflow.infra.spark import get_spark  # noqa: PLC0415 (loads Spark)

        spark = self.options.spark or get_spark()
        conf = spark.conf
        refuse_unencrypted(conf, self._plan.face, self._plan.ignore_ssl_conf)
        if self._plan.layout is not None:
            tasks, ranks_per_task = len(self._plan.layout), self._plan.layout
        else:
            tasks, ranks_per_task = self._task_layout(conf)
        asked = self._plan.asked or (
            f"np={self.np}" + (f" ({tasks} tasks of several GPUs)" if ranks_per_task else "")
        )
        wait_for_slots(spark, tasks, self.options.slot_wait_s, asked, self._plan.size_argument)
        # Where the slots cannot be counted (Spark Connect), or vanished since they were, Spark's
        # barrier check refuses the stage within seconds: an executor killed moments ago is
        # coming back. Submit it again while slot_wait_s lasts, as a counted wait would have.
        deadline = time.monotonic() + self.options.slot_wait_s
        refusals = 0
        while True:
            try:
                return self._barrier_job(spark, payload, sink, tasks, ranks_per_task)
            except SparkJobFailed as e:
                if not refused_for_slots(e):
                    raise
                if time.monotonic() >= deadline:
                    raise SparkJobFailed(
                        f"{e} It was refused {refusals + 1} time(s) over "
                        f"{self.options.slot_wait_s:g} s (slot_wait_s): lower "
                        f"{self._plan.size_argument}, or add executors or cores"
                    ) from None
                if not refusals:
                    logger.warning(
                        "%s: Spark refused the barrier stage for want of %d task slots (its "
                        "executors may be coming back); submitting it again each %g s for up "
                        "to %g s (slot_wait_s)",
                        asked,
                        tasks,
                        RESUBMIT_EVERY_S,
                        self.options.slot_wait_s,
                    )
                refusals += 1
                time.sleep(RESUBMIT_EVERY_S)

    def _barrier_job(
        self, spark, payload: bytes, sink: RunLog, tasks: int, ranks_per_task
    ) -> bytes | None:
        """One barrier stage of ``tasks`` tasks running the ranks, and the driver's channel."""
        from hvdflow.infra.spark import client_address  # noqa: PLC0415 (loads Spark)

        with DriverChannel(
            client_address(spark),
            sink,
            rendezvous=self._uses_horovod,
            relay=self._relay(),
            slots=abs(self.np),
        ) as channel:
            spec = self._spec(payload, channel, ranks_per_task)
            tag = f"hvdflow-{self.run_id}"
            outcome: dict[str, Any] = {}
            done = threading.Event()

            def job() -> None:
                try:
                    outcome["result"] = run_barrier_stage(spark, spec, tasks, tag)
                except BaseException as e:  # reported by the waiting thread
                    outcome["error"] = e
                finally:
                    done.set()

            threading.Thread(target=job, daemon=True, name="hvdflow-barrier-job").start()
            logger.info(
                "%s: %d ranks in %d barrier task(s), Spark job tag %s",
                self._plan.face,
                self.np,
                tasks,
                tag,
            )
            self._wait(
                done,
                channel,
                sink,
                cancel=lambda: spark.interruptTag(tag),
                ended_badly=lambda: "error" in outcome,
            )
            if "error" in outcome:
                raise SparkJobFailed(
                    f"{self._name()}: the Spark job that ran the {self.np} ranks failed: "
                    f"{first_line(outcome['error'])}"
                ) from None
            return outcome["result"]

    def _run_on_driver(self, payload: bytes, sink: RunLog) -> bytes | None:
        """The ranks as one task on the driver: processes of this machine, no Spark."""
        n = -self.np
        plan = self._plan.gpu_plan
        gpus = list(plan.driver_gpus) if plan.driver_gpus is not None else driver_gpu_addresses()
        if plan.per_task is None and 0 < len(gpus) < n:
            logger.warning(
                "np=%d on a driver with %d GPU(s): ranks share them (one per rank is best)",
                self.np,
                len(gpus),
            )
        with DriverChannel("127.0.0.1", sink, rendezvous=self._uses_horovod) as channel:
            # A worker per task (per_task) runs alone; HorovodRunner's ranks run together.
            layout = self._plan.layout or (None if plan.per_task is not None else (n,))
            spec = self._spec(payload, channel, layout)
            outcome: dict[str, Any] = {}
            done = threading.Event()

            def task() -> None:
                try:
                    outcome["result"] = run_task(
                        spec, 0, ["127.0.0.1"], gpus, all_gather=lambda m: [m]
                    )
                except BaseException as e:
                    outcome["error"] = e
                finally:
                    done.set()

            threading.Thread(target=task, daemon=True, name="hvdflow-driver-task").start()
            self._wait(
                done, channel, sink, cancel=lambda: None, ended_badly=lambda: "error" in outcome
            )
            error = outcome.get("error")
            if isinstance(error, RankFailed):
                raise rank_failed(f"{self._name()}: {error}", error.cause)
            if error is not None:
                raise RuntimeError(f"{self._name()}: {error}") from None
            return outcome.get("result")

    def _report_lost(self, channel: DriverChannel, sink: RunLog) -> None:
        for lost in channel.liveness.lost(self.options.heartbeat_timeout_s):
            # The driver's own report: the output the rank sent before it went silent.
            channel.report({**lost, "tail": sink.tail(lost["rank"])})

    def _wait(
        self,
        done: threading.Event,
        channel: DriverChannel,
        sink: RunLog,
        cancel: Callable[[], None],
        ended_badly: Callable[[], bool],
    ) -> None:
        """Wait for the ranks; on a failure, a lost task, a timeout or Ctrl-C stop all, raise."""
        started = time.monotonic()
        timeout_s = self.options.timeout_s
        try:
            while not done.wait(_POLL_S):
                self._report_lost(channel, sink)
                if self.options.stall_timeout_s and channel.progress.stalled(
                    self.options.stall_timeout_s
                ):
                    channel.report(self._stall_report(channel))
                if channel.failed.is_set():
                    break
                if timeout_s is not None and time.monotonic() - started > timeout_s:
                    self._stop(done, channel, cancel)
                    raise TimeoutError(
                        f"{self._name()} did not finish within {timeout_s:g} s "
                        "(LaunchOptions.timeout_s): raise timeout_s or shorten the run"
                    )
        except KeyboardInterrupt:
            logger.warning("interrupted: stopping the %d ranks", abs(self.np))
            self._stop(done, channel, cancel)
            raise
        if ended_badly() and not channel.failed.is_set():
            # A task reports its rank's failure before it raises: give the report a moment to
            # land, so the error names the rank instead of Spark's generic task failure.
            channel.failed.wait(1.0)
        if channel.failed.is_set():
            # The other ranks usually fail within moments of the first: collect their reports
            # so that the error names the rank that caused it, not the first to notice.
            channel.gather_failures(
                abs(self.np), _SETTLE_S, on_poll=lambda: self._report_lost(channel, sink)
            )
            self._stop(done, channel, cancel)
            failure, others = channel.root_failure()
            # A task that died reported nothing: its rank's last lines are the driver's own.
            lines = failure.get("tail") or sink.tail(failure["rank"])
            tail = "\n".join(lines) or "(it wrote no output)"
            also = f" (then rank(s) {', '.join(map(str, others))} failed too)" if others else ""
            heading = (
                STACKS_HEADING if failure.get("cause") == _wire.CAUSE_STALLED else OUTPUT_HEADING
            )
            what = error_line(lines)
            raise rank_failed(
                f"{self._name()}: {failure['reason']}{also}{f': {what}' if what else ''}. "
                f"{heading}\n{tail}",
                failure.get("cause"),
            )
        if not ended_badly() and not channel.drain(_DRAIN_S):
            logger.warning(
                "a task's connection was still open %g s after the ranks ended: its last "
                "lines may be missing from the log",
                _DRAIN_S,
            )

    def _stall_report(self, channel: DriverChannel) -> dict:
        """Gather every rank's stacks (a few seconds at most), then describe the stall."""
        progress, _hosts = channel.progress.snapshot()
        logger.warning(
            "ranks %s finished no batch for %g s (stall_timeout_s): collecting their stacks",
            channel.progress.stalled(self.options.stall_timeout_s),
            self.options.stall_timeout_s,
        )
        channel.request_stacks()
        deadline = time.monotonic() + _STACKS_WAIT_S
        while time.monotonic() < deadline and not set(progress) <= set(channel.stacks):
            time.sleep(0.1)
        progress, hosts = channel.progress.snapshot()
        return _stall.stall_report(
            progress, self.options.stall_timeout_s, dict(channel.stacks), hosts, time.time()
        )

    def _stop(self, done: threading.Event, channel: DriverChannel, cancel: Callable[[], None]):
        channel.abort()
        try:
            cancel()
        except Exception:  # the Spark job may already be gone
            logger.debug("cancelling the Spark job failed", exc_info=True)
        if not done.wait(_STOP_GRACE_S):
            logger.warning(
                "ranks still stopping after %.0f s (hvdflow.infra.launcher.runner._STOP_GRACE_S); "
                "each task kills its rank when it sees the run cancelled",
                _STOP_GRACE_S,
            )
