"""TorchDistributor: pyspark's ``pyspark.ml.torch.distributor.TorchDistributor`` API on
hvdflow's barrier launcher.

Code written for pyspark's moves here by changing one import::

    from hvdflow import TorchDistributor  # was: from pyspark.ml.torch.distributor import ...

    def train(learning_rate):
        import torch.distributed as dist
        dist.init_process_group("gloo")   # RANK, WORLD_SIZE, MASTER_ADDR, ... are set
        model = torch.nn.parallel.DistributedDataParallel(...)
        ...
        return accuracy                   # rank 0's comes back

    TorchDistributor(num_processes=2, local_mode=False, use_gpu=False).run(train, 1e-3)
    TorchDistributor(num_processes=2, local_mode=False, use_gpu=False).run("train.py", "--lr=1e-3")

As in the original: ``local_mode`` (the default, as there) runs the processes on the driver;
otherwise one Spark barrier task per process (with GPUs, ``ceil(num_processes /
spark.task.resource.gpu.amount)`` tasks); each process gets torchrun's environment; a
function's rank-0 return value comes back, a script's None; ``use_gpu=False`` hides the GPUs;
a cluster with ``spark.ssl.enabled`` is refused unless ``pytorch.spark.distributor.ignoreSsl``
is true. On top of it, from hvdflow's launcher: the processes' output streams to the driver
with rank prefixes, a process that dies or hangs fails the run naming its rank and host within
seconds, a CPU process's threads are capped at its share of the host's cores, each run has a
rendezvous id of its own, and no process is left behind. What differs, and why, is in the
README's table.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
import runpy
import sys
from functools import partial
from typing import Any

from hvdflow.infra.connect import is_connect
from hvdflow.infra.constants import (
    CUDA_VISIBLE_DEVICES,
    TORCHELASTIC_MAX_RESTARTS,
    TORCHELASTIC_RESTART_COUNT,
)
from hvdflow.infra.launcher import _wire
from hvdflow.infra.launcher._placement import GpuPlan, gpus_owned, split_evenly
from hvdflow.infra.launcher._slots import task_gpu_amount
from hvdflow.infra.launcher.errors import GpuSchedulingNotEnabled, RankFailed, headline
from hvdflow.infra.launcher.options import LaunchOptions, checked_options
from hvdflow.infra.launcher.runner import HorovodRunner, LaunchPlan, face_options

logger = logging.getLogger(__name__)

# The original's override for clusters with spark.ssl.enabled.
IGNORE_SSL_CONF = "pytorch.spark.distributor.ignoreSsl"
# The Spark resource name the original schedules GPUs under (it has no argument for another).
GPU_RESOURCE = "gpu"


# How errors name this face, its size argument and its SSL override (the launcher refuses an
# encrypted cluster before any task starts).
FACE = LaunchPlan(
    face="TorchDistributor", size_argument="num_processes", ignore_ssl_conf=IGNORE_SSL_CONF
)


class TorchDistributor:
    """Runs a PyTorch training function, or a training script, as the processes of a
    ``torch.distributed`` job, one Spark barrier task each (or on the driver).

    Args:
        num_processes: processes that train together; at least 1. On GPUs, one per GPU.
        local_mode: run every process on the driver (the original's default); with
            ``use_gpu``, at most as many as the driver has GPUs (more are cut to that, with a
            warning, as the original does).
        use_gpu: train on GPUs (Spark's GPU-aware scheduling must be on for the tasks,
            ``spark.driver.resource.gpu`` for local mode); False hides every GPU
            (CUDA_VISIBLE_DEVICES="").
        max_restarts: hvdflow's addition, torchrun's ``--max-restarts``: how many times a run
            whose process was killed or whose host was lost (``RankFailed.transient``) starts
            again, every process anew, with TORCHELASTIC_RESTART_COUNT counting the restarts;
            ``train_fn`` resumes from its own checkpoint, as under torchrun. A process that
            raised is not restarted: it would fail the same way. pyspark's never restarts
            (SPARK-25161).
        options: what hvdflow adds (``LaunchOptions``: ``spark``, ``start_timeout_s``,
            ``stall_timeout_s``, ``heartbeat_timeout_s``, ``log_dir``, ``on_log_line``, ...);
            its ``engine`` is always ``torch`` here.

    Attributes:
        spark: the SparkSession the processes run on (the active one, as the original).
        num_tasks: the number of Spark tasks that train (``num_processes`` in local mode, as
            the original reports it).
    """

    def __init__(
        self,
        num_processes: int = 1,
        local_mode: bool = True,
        use_gpu: bool = True,
        *,
        max_restarts: int = 0,
        options: LaunchOptions | None = None,
        **moved: Any,
    ):
        options = checked_options(
            options, "TorchDistributor", f"num_processes={num_processes!r}", moved
        )
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
        self._options = face_options(
            options, FACE, engine=_wire.TORCH, on_log_line=options.on_log_line or _print_line
        )
        self.spark = self._options.spark
        self._driver_gpus: list[str] = []
        self.num_tasks = self._get_num_tasks()
        if local_mode:
            logger.warning(
                "TorchDistributor runs in local mode: its %d process(es) compete for the "
                "driver's resources with whatever else runs there",
                self.num_processes,
            )

    def _get_num_tasks(self) -> int:
        """Spark tasks that train: ``num_processes`` on CPU and in local mode; with GPUs,
        ``ceil(num_processes / spark.task.resource.gpu.amount)``. Checks the GPU set-up."""
        conf = self.spark.conf
        if not self.use_gpu:
            return self.num_processes
        if not self.local_mode:
            key = f"spark.task.resource.{GPU_RESOURCE}.amount"
            amount = task_gpu_amount(conf, GPU_RESOURCE)
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
                return self._runner.run(main)
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

    def _cluster_runner(self, restart: int) -> HorovodRunner:
        tasks = self.num_tasks
        layout = tuple(split_evenly(self.num_processes, tasks))
        plan = dataclasses.replace(
            FACE,
            layout=layout,
            # Every process of a task sees the task's GPUs, as torchrun's processes see their
            # node's; LOCAL_RANK tells each which to take. 0 hides them.
            gpu_plan=GpuPlan(per_task=layout if self.use_gpu else (0,) * tasks),
            asked=f"num_processes={self.num_processes} ({tasks} Spark tasks)",
        )
        logger.info(
            "TorchDistributor: %d process(es) in %d Spark barrier task(s), %s",
            self.num_processes,
            tasks,
            "GPU" if self.use_gpu else "CPU only",
        )
        return self._launcher(self.num_processes, restart, plan)

    def _local_runner(self, restart: int) -> HorovodRunner:
        n = self.num_processes
        plan = dataclasses.replace(
            FACE,
            layout=(n,),
            gpu_plan=GpuPlan(
                per_task=(n if self.use_gpu else 0,), driver_gpus=tuple(self._driver_gpus)
            ),
            asked=f"num_processes={n} (local mode)",
        )
        return self._launcher(-n, restart, plan)

    def _launcher(self, np: int, restart: int, plan: LaunchPlan) -> HorovodRunner:
        """The launcher for one attempt; its processes learn which (torchrun's variables)."""
        horovod = self._options.horovod
        counts = {
            TORCHELASTIC_RESTART_COUNT: str(restart),
            TORCHELASTIC_MAX_RESTARTS: str(self.max_restarts),
        }
        horovod = horovod.model_copy(update={"extra_env": {**horovod.extra_env, **counts}})
        options = dataclasses.replace(self._options, horovod=horovod)
        return HorovodRunner(np=np, options=options, _plan=plan)


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
