"""The launcher's public faces, each the API of the runner it replaces (Databricks'
``HorovodRunner``, spark-tensorflow-distributor's ``MirroredStrategyRunner``, pyspark's
``TorchDistributor``), over one core (``_driver.Launch``): each face checks its arguments, builds
one frozen ``LaunchPlan``, runs it.

Code written for the originals moves here by changing one import. On top of them: the ranks'
output streams to the driver with rank prefixes, a rank that dies or hangs fails the run naming
its rank and host within seconds, and no process is left behind (docs/drop-in.md).
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
import runpy
import sys
from collections.abc import Callable
from functools import partial
from typing import Any

from hvdflow.infra.connect import is_connect
from hvdflow.infra.constants import (
    CUDA_VISIBLE_DEVICES,
    TORCHELASTIC_MAX_RESTARTS,
    TORCHELASTIC_RESTART_COUNT,
)
from hvdflow.infra.launcher import _wire
from hvdflow.infra.launcher._driver import Launch, LaunchPlan, Verbosity, task_gpu_amount
from hvdflow.infra.launcher._engines import GpuPlan, gpus_owned, split_evenly
from hvdflow.infra.launcher.errors import GpuSchedulingNotEnabled, RankFailed, headline
from hvdflow.infra.launcher.options import LaunchOptions, checked_options

logger = logging.getLogger(__name__)


def face_options(options: LaunchOptions | None, **fixed: Any) -> LaunchOptions:
    """A face's options: what the face fixes (``engine``, ...), on the session the options name
    or else the active (or default) one; checked now (``LaunchOptions`` checks itself)."""
    options = checked_options(options)
    spark = options.spark
    if spark is None:
        from hvdflow.infra.spark import get_spark  # noqa: PLC0415 (lazy: it loads Spark)

        spark = get_spark()
    return dataclasses.replace(options, spark=spark, **fixed)


# --- HorovodRunner ---


class HorovodRunner:
    """Runs ``main`` as ``np`` Horovod ranks and returns rank 0's return value.

    Args:
        np: number of ranks. ``np > 0``: Spark barrier tasks, one rank per task slot; where a
            task holds k GPUs (``spark.task.resource.gpu.amount``), ``ceil(np / k)`` tasks run
            up to k ranks, one GPU each. ``np < 0``: ``-np`` processes on the driver, without
            Spark, one of its GPUs each where it has some.
        driver_log_verbosity: ``"log_callback_only"`` shows only ``log_to_driver`` messages in
            the driver's log, ``"all"`` every line the ranks write; every line always goes to
            the run's log file (``log_path``) and to ``options.on_log_line``.
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
    ):
        self._plan = LaunchPlan(
            np=np, options=checked_options(options), driver_log_verbosity=driver_log_verbosity
        )
        self.np = np
        self.driver_log_verbosity = driver_log_verbosity
        self.options = self._plan.options
        self._launch: Launch | None = None

    @property
    def log_path(self) -> str | None:
        """The last run's log file (every rank's output, rank-prefixed)."""
        return self._launch.log_path if self._launch else None

    @property
    def run_id(self) -> str | None:
        return self._launch.run_id if self._launch else None

    def run(self, main: Callable[..., Any], **kwargs: Any) -> Any:
        """Run ``main(**kwargs)`` on every rank; return what rank 0 returned."""
        self._launch = Launch(self._plan)
        return self._launch.run(main, kwargs)


# --- MirroredStrategyRunner ---

# The original's override for clusters with spark.ssl.enabled.
MIRRORED_IGNORE_SSL = "tensorflow.spark.distributor.ignoreSsl"
# How errors name this face, its size argument and its SSL override (the launcher refuses an
# encrypted cluster before any task starts); likewise TORCH_PLAN.
MIRRORED_PLAN = LaunchPlan(
    face="MirroredStrategyRunner", size_argument="num_slots", ignore_ssl_conf=MIRRORED_IGNORE_SSL
)


class MirroredStrategyRunner:
    """Runs a TensorFlow training function as the workers of a MultiWorkerMirroredStrategy,
    one Spark barrier task each.

    Args:
        num_slots: GPUs (``use_gpu=True``) or CPU-only Spark tasks that train together; at
            least 1. With GPUs held k per task, ``ceil(num_slots / k)`` tasks train, one worker
            each, the GPUs spread evenly over them (5 over tasks of 2: 2, 2, 1).
        local_mode: train in one process on the driver, over ``num_slots`` of the driver's
            GPUs (``spark.driver.resource.<gpu_resource_name>``, or CUDA_VISIBLE_DEVICES where
            set); on CPU, ``num_slots`` must be 1.
        use_gpu: train on the tasks' GPUs (Spark's GPU-aware scheduling must be on); False
            hides every GPU (CUDA_VISIBLE_DEVICES="").
        gpu_resource_name: the Spark resource name the GPUs are scheduled under.
        use_custom_strategy: ``train_fn`` creates its own strategy; otherwise the runner creates
            a MultiWorkerMirroredStrategy and calls ``train_fn`` inside its scope.
        options: what hvdflow adds (``LaunchOptions``: ``spark``, ``stall_timeout_s``,
            ``log_dir``, ...); its ``engine`` is always ``tf_collective`` here.

    Inside ``train_fn``, ``pyspark.BarrierTaskContext.get()`` answers as in the worker's Spark
    task (``allGather``, ``barrier``, ``getTaskInfos``, ...), as in the original; not locally.

    Attributes:
        sc: the SparkContext the runner trains on (the active session's, as the original).
    """

    def __init__(
        self,
        *,
        num_slots: int,
        local_mode: bool = False,
        use_gpu: bool = True,
        gpu_resource_name: str = "gpu",
        use_custom_strategy: bool = False,
        options: LaunchOptions | None = None,
    ):
        if isinstance(num_slots, bool) or not isinstance(num_slots, int) or num_slots <= 0:
            raise ValueError(
                f"num_slots={num_slots!r}: expected a positive number of GPUs (use_gpu=True) "
                "or Spark tasks (use_gpu=False); it cannot be less than or equal to 0"
            )
        self.num_slots = num_slots
        self.local_mode = local_mode
        self.use_gpu = use_gpu
        self.gpu_resource_name = gpu_resource_name
        self.use_custom_strategy = use_custom_strategy
        self._options = face_options(options, engine=_wire.TF_COLLECTIVE)
        # The original's attribute; a Spark Connect session has no SparkContext.
        spark = self._options.spark
        self.sc = None if is_connect(spark) else spark.sparkContext
        logger.info("MirroredStrategyRunner: %s training", "GPU" if use_gpu else "CPU")
        if local_mode:
            logger.warning(
                "MirroredStrategyRunner runs in local mode on the driver: it competes for the "
                "driver's resources with whatever else runs there"
            )
            self._num_tasks = None
        else:
            self._num_tasks = self.get_num_tasks()
            logger.info("MirroredStrategyRunner: will run with %d Spark tasks", self._num_tasks)

    def get_num_tasks(self) -> int:
        """The number of Spark tasks that train: ``num_slots`` on CPU; with GPUs,
        ``ceil(num_slots / spark.task.resource.<gpu_resource_name>.amount)``."""
        if not self.use_gpu:
            return self.num_slots
        key = f"spark.task.resource.{self.gpu_resource_name}.amount"
        amount = task_gpu_amount(self._options.spark.conf, self.gpu_resource_name)
        if amount is None:
            raise GpuSchedulingNotEnabled(
                f"use_gpu=True but the Spark conf {key} is not set: this cluster may not have "
                "Spark's GPU-aware scheduling enabled. Set it (and the executors' and workers' "
                f"{self.gpu_resource_name} resources) or pass use_gpu=False to train on CPU"
            )
        if amount < 1:
            raise ValueError(
                f"the Spark conf {key} is {amount:g}: a worker needs at least one whole GPU"
            )
        return math.ceil(self.num_slots / int(amount))

    @property
    def log_path(self) -> str | None:
        return self._runner.log_path if hasattr(self, "_runner") else None

    def run(self, train_fn, **kwargs: Any) -> Any:
        """``train_fn(**kwargs)`` on every worker; the chief's (worker 0's) return value, or in
        local mode the one worker's."""
        main = partial(_in_strategy, train_fn, self.use_custom_strategy)
        self._runner = self._local_runner() if self.local_mode else self._cluster_runner()
        return self._runner.run(main, kwargs)

    def _cluster_runner(self) -> Launch:
        tasks = self._num_tasks
        per_task = split_evenly(self.num_slots, tasks) if self.use_gpu else [0] * tasks
        gpus = GpuPlan(per_task=tuple(per_task), resource_name=self.gpu_resource_name)
        asked = f"num_slots={self.num_slots} ({tasks} Spark tasks)"
        plan = dataclasses.replace(MIRRORED_PLAN, gpu_plan=gpus, asked=asked)
        logger.info(
            "MirroredStrategyRunner: %d worker(s) as Spark barrier tasks, %s",
            tasks,
            f"GPUs {'/'.join(map(str, per_task))}" if self.use_gpu else "CPU only",
        )
        return Launch(dataclasses.replace(plan, np=tasks, options=self._options))

    def _local_runner(self) -> Launch:
        """One worker on the driver: a single-machine strategy over num_slots of its GPUs."""
        if self.use_gpu:
            owned = self._driver_gpus()
            if self.num_slots > len(owned):
                raise ValueError(
                    f"num_slots={self.num_slots} GPUs were requested for local training but "
                    f"the driver has {len(owned)} ({', '.join(owned) or 'none'})"
                )
            per_task = self.num_slots
        else:
            if self.num_slots > 1:
                raise ValueError(
                    f"num_slots={self.num_slots} with local_mode=True and use_gpu=False: a CPU "
                    "machine is one slot, set num_slots=1 (HorovodRunner(np=-n, "
                    "engine='tf_collective') runs n CPU workers on the driver)"
                )
            owned, per_task = [], 0
        gpus = GpuPlan(
            per_task=(per_task,), resource_name=self.gpu_resource_name, driver_gpus=tuple(owned)
        )
        asked = f"num_slots={self.num_slots} (local mode)"
        plan = dataclasses.replace(MIRRORED_PLAN, gpu_plan=gpus, asked=asked)
        return Launch(dataclasses.replace(plan, np=-1, options=self._options))

    def _driver_gpus(self) -> list[str]:
        """The driver's GPUs: CUDA_VISIBLE_DEVICES where set, else its Spark GPU resource."""
        # Through Spark Connect, local mode runs on this client, which holds no Spark resource.
        resource = self.sc.resources.get(self.gpu_resource_name) if self.sc else None
        visible = os.environ.get(CUDA_VISIBLE_DEVICES)
        if resource is None and visible is None:
            name = self.gpu_resource_name
            raise ValueError(
                f"use_gpu=True in local mode but the driver holds no {name!r} resource: set "
                f"spark.driver.resource.{name}.amount and .discoveryScript (or "
                "CUDA_VISIBLE_DEVICES), or pass use_gpu=False"
            )
        return gpus_owned(visible, resource.addresses if resource else ())


def _in_strategy(train_fn, use_custom_strategy: bool, **kwargs: Any) -> Any:
    """Runs in each worker: ``train_fn`` inside a MultiWorkerMirroredStrategy's scope."""
    if use_custom_strategy:
        return train_fn(**kwargs)
    import tensorflow as tf

    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    with strategy.scope():
        return train_fn(**kwargs)


# --- TorchDistributor ---

# pyspark's override for clusters with spark.ssl.enabled.
TORCH_IGNORE_SSL = "pytorch.spark.distributor.ignoreSsl"
# The Spark resource name the original schedules GPUs under (it has no argument for another).
GPU_RESOURCE = "gpu"
TORCH_PLAN = LaunchPlan(
    face="TorchDistributor", size_argument="num_processes", ignore_ssl_conf=TORCH_IGNORE_SSL
)


class TorchDistributor:
    """Runs a PyTorch training function, or a training script, as the processes of a
    ``torch.distributed`` job, one Spark barrier task each (or on the driver).

    Args:
        num_processes: processes that train together; at least 1. On GPUs, one per GPU.
        local_mode: run every process on the driver (the original's default); with ``use_gpu``,
            at most one per driver GPU (more are cut, with a warning, as in the original).
        use_gpu: train on GPUs (Spark's GPU-aware scheduling on for the tasks, or
            ``spark.driver.resource.gpu`` locally); False hides every GPU (CUDA_VISIBLE_DEVICES="").
        max_restarts: hvdflow's addition, torchrun's ``--max-restarts``: how many times a run
            whose process was killed or whose host was lost (``RankFailed.transient``) starts
            again, every process anew (TORCHELASTIC_RESTART_COUNT counts), resuming from its own
            checkpoint. A process that raised is not restarted: it would fail the same way.
        options: what hvdflow adds (``LaunchOptions``: ``spark``, ``stall_timeout_s``,
            ``log_dir``, ...); its ``engine`` is always ``torch`` here.

    Attributes:
        spark: the SparkSession the processes run on (the active one, as the original).
        num_tasks: the number of Spark tasks that train (``num_processes`` in local mode).
        input_params: ``num_processes``, ``local_mode``, ``use_gpu`` and ``num_tasks``, as the
            original records them.
    """

    def __init__(
        self,
        num_processes: int = 1,
        local_mode: bool = True,
        use_gpu: bool = True,
        *,
        max_restarts: int = 0,
        options: LaunchOptions | None = None,
    ):
        if isinstance(num_processes, bool) or not isinstance(num_processes, int):
            raise ValueError(
                f"num_processes={num_processes!r}: expected a positive integer, the number of "
                "processes that train together"
            )
        if num_processes <= 0:
            # The original's message, then what to do.
            raise ValueError(
                f"num_processes has to be a positive integer (got {num_processes}): set it to "
                "the number of processes that train together"
            )
        if isinstance(max_restarts, bool) or not isinstance(max_restarts, int) or max_restarts < 0:
            raise ValueError(f"max_restarts={max_restarts!r}: expected 0 or more restarts")
        self.max_restarts = max_restarts
        self.num_processes = num_processes
        self.local_mode = local_mode
        self.use_gpu = use_gpu
        # Every line the processes write is printed on the driver's stdout, as the original
        # streams each process's output there, unless the options take the lines themselves.
        options = checked_options(options)
        self._options = face_options(
            options, engine=_wire.TORCH, on_log_line=options.on_log_line or _print_line
        )
        self.spark = self._options.spark
        self._driver_gpus: list[str] = []
        self.num_tasks = self._get_num_tasks()
        # The original's attributes: where it runs, its logger and its SSL override's conf.
        self.is_remote = is_connect(self.spark)
        master = self.spark.conf.get("spark.master", "")
        self.is_spark_local_master = master == "local" or master.startswith("local[")
        self.logger, self.ssl_conf = logger, TORCH_IGNORE_SSL
        # The original's record of its arguments, as its own tests read it.
        self.input_params = {
            "num_processes": self.num_processes,
            "local_mode": local_mode,
            "use_gpu": use_gpu,
            "num_tasks": self.num_tasks,
        }
        if local_mode:
            logger.warning(
                "TorchDistributor runs in local mode: its %d process(es) compete for the "
                "driver's resources with whatever else runs there",
                self.num_processes,
            )

    def _get_num_tasks(self) -> int:
        """Spark tasks that train: ``num_processes`` on CPU and in local mode; with GPUs,
        ``ceil(num_processes / spark.task.resource.gpu.amount)``. Checks the GPU set-up."""
        if not self.use_gpu:
            return self.num_processes
        if not self.local_mode:
            key = f"spark.task.resource.{GPU_RESOURCE}.amount"
            amount = task_gpu_amount(self.spark.conf, GPU_RESOURCE)
            if amount is None or amount < 1:
                raise GpuSchedulingNotEnabled(
                    f"'{key}' was unset, so gpu usage is unavailable: set it (and the "
                    "executors' and workers' gpu resources) to train on the tasks' GPUs, or "
                    "pass use_gpu=False to train on CPU"
                )
            return math.ceil(self.num_processes / int(amount))
        owned = self._owned_driver_gpus()
        if self.num_processes > len(owned):
            logger.warning(
                "'num_processes' cannot be set to a value greater than the number of available "
                "GPUs on the driver, which is %d. 'num_processes' was reset to be equal to the "
                "number of available GPUs.",
                len(owned),
            )
            self.num_processes = len(owned)
        self._driver_gpus = owned[: self.num_processes]
        return self.num_processes

    def _owned_driver_gpus(self) -> list[str]:
        """The driver's GPUs: CUDA_VISIBLE_DEVICES where set, else its Spark GPU resource."""
        # Through Spark Connect, local mode runs on this client, which holds no Spark resource.
        resource = (
            None if is_connect(self.spark) else self.spark.sparkContext.resources.get(GPU_RESOURCE)
        )
        visible = os.environ.get(CUDA_VISIBLE_DEVICES)
        if resource is None and visible is None:
            raise RuntimeError(
                "GPUs were unable to be found on the driver: set "
                f"spark.driver.resource.{GPU_RESOURCE}.amount and .discoveryScript (or "
                "CUDA_VISIBLE_DEVICES), or pass use_gpu=False"
            )
        owned = gpus_owned(visible, resource.addresses if resource else ())
        if not owned:
            raise RuntimeError(
                "GPU resources were not configured properly on the driver: it holds none; "
                "pass use_gpu=False to train on CPU"
            )
        return owned

    @property
    def log_path(self) -> str | None:
        """The last run's log file (every process's output, rank-prefixed)."""
        return self._runner.log_path if hasattr(self, "_runner") else None

    def run(self, train_object, *args: Any, **kwargs: Any) -> Any:
        """Run ``train_object(*args, **kwargs)`` in every process and return rank 0's return
        value; or, where ``train_object`` is a path to a Python file, run it as ``__main__``
        in every process with ``args`` as its command line, and return None."""
        if isinstance(train_object, str):
            if kwargs:
                raise ValueError(
                    "Running pytorch file does not support key-word type arguments: pass "
                    f"them as command-line strings, e.g. '--{next(iter(kwargs))}=...'"
                )
            if not os.path.isfile(train_object):
                raise FileNotFoundError(
                    f"{train_object!r} is not a file: TorchDistributor.run takes a function "
                    "or the path of a Python script every process can read"
                )
            main = partial(_run_script, os.path.abspath(train_object), [str(a) for a in args])
        elif callable(train_object):
            main = partial(_call, train_object, args, kwargs)
        else:
            raise TypeError(
                f"train_object={train_object!r}: expected a function or the path of a Python script"
            )
        for restart in range(self.max_restarts + 1):
            self._runner = (
                self._local_runner(restart) if self.local_mode else self._cluster_runner(restart)
            )
            try:
                return self._runner.run(main, {})
            except RankFailed as e:
                if not e.transient or restart == self.max_restarts:
                    raise
                logger.warning(
                    "TorchDistributor: restart %d of %d (max_restarts) after: %s",
                    restart + 1,
                    self.max_restarts,
                    headline(e),
                )
        raise AssertionError("unreachable: the last attempt returns or raises")

    def _cluster_runner(self, restart: int) -> Launch:
        tasks = self.num_tasks
        layout = tuple(split_evenly(self.num_processes, tasks))
        # Every process of a task sees the task's GPUs, as torchrun's processes see their node's;
        # LOCAL_RANK tells each which to take. 0 hides them.
        gpus = GpuPlan(per_task=layout if self.use_gpu else (0,) * tasks)
        asked = f"num_processes={self.num_processes} ({tasks} Spark tasks)"
        plan = dataclasses.replace(TORCH_PLAN, layout=layout, gpu_plan=gpus, asked=asked)
        logger.info(
            "TorchDistributor: %d process(es) in %d Spark barrier task(s), %s",
            self.num_processes,
            tasks,
            "GPU" if self.use_gpu else "CPU only",
        )
        return self._launcher(self.num_processes, restart, plan)

    def _local_runner(self, restart: int) -> Launch:
        n = self.num_processes
        gpus = GpuPlan(per_task=(n if self.use_gpu else 0,), driver_gpus=tuple(self._driver_gpus))
        asked = f"num_processes={n} (local mode)"
        plan = dataclasses.replace(TORCH_PLAN, layout=(n,), gpu_plan=gpus, asked=asked)
        return self._launcher(-n, restart, plan)

    def _launcher(self, np: int, restart: int, plan: LaunchPlan) -> Launch:
        """The launcher for one attempt; its processes learn which (torchrun's variables)."""
        horovod = self._options.horovod
        counts = {
            TORCHELASTIC_RESTART_COUNT: str(restart),
            TORCHELASTIC_MAX_RESTARTS: str(self.max_restarts),
        }
        horovod = horovod.model_copy(update={"extra_env": {**horovod.extra_env, **counts}})
        options = dataclasses.replace(self._options, horovod=horovod)
        return Launch(dataclasses.replace(plan, np=np, options=options))


def _print_line(line: _wire.LogLine) -> None:
    print(line.formatted(), flush=True)  # noqa: T201 (the original prints the output too)


def _call(train_fn, args: tuple, kwargs: dict) -> Any:
    """Runs in each process: the function with the arguments ``run`` was given."""
    return train_fn(*args, **kwargs)


def _run_script(path: str, args: list[str]) -> None:
    """Runs in each process: the script as ``__main__`` with ``args`` as its command line, as
    torchrun runs it. A ``sys.exit(0)`` is a success; another status fails the process."""
    sys.argv = [path, *args]
    sys.path.insert(0, os.path.dirname(path))
    try:
        runpy.run_path(path, run_name="__main__")
    except SystemExit as e:
        if e.code not in (None, 0):
            raise
