"""MirroredStrategyRunner: spark-tensorflow-distributor's API on hvdflow's barrier launcher.

Databricks deprecated ``spark-tensorflow-distributor``; code written for it moves here by
changing one import::

    from hvdflow import MirroredStrategyRunner  # was: from spark_tensorflow_distributor import ...

    def train():
        import tensorflow as tf
        model = ...            # plain Keras: the runner builds it in the strategy's scope
        model.fit(dataset, epochs=3, steps_per_epoch=5)

    MirroredStrategyRunner(num_slots=2, use_gpu=False).run(train)

As in the original: ``num_slots`` counts GPUs when ``use_gpu`` (``ceil(num_slots /
spark.task.resource.<gpu_resource_name>.amount)`` barrier tasks, each one worker of a
``tf.distribute.MultiWorkerMirroredStrategy`` over the GPUs its task holds) and CPU tasks when
not; ``local_mode`` runs one worker on the driver over ``num_slots`` of the driver's GPUs; a
cluster with ``spark.ssl.enabled`` is refused unless ``tensorflow.spark.distributor.ignoreSsl``
is true. On top of it, from hvdflow's launcher: the workers' output streams to the driver with
rank prefixes, a worker that dies or hangs fails the run naming it, and no process is left
behind. What differs, and why, is in the README's table.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
from functools import partial
from typing import Any

from hvdflow.infra.connect import is_connect
from hvdflow.infra.constants import CUDA_VISIBLE_DEVICES
from hvdflow.infra.launcher import _wire
from hvdflow.infra.launcher._placement import GpuPlan, gpus_owned, split_evenly
from hvdflow.infra.launcher._slots import task_gpu_amount
from hvdflow.infra.launcher.errors import GpuSchedulingNotEnabled
from hvdflow.infra.launcher.options import LaunchOptions, checked_options
from hvdflow.infra.launcher.runner import HorovodRunner, LaunchPlan, face_options

logger = logging.getLogger(__name__)

# The original's override for clusters with spark.ssl.enabled.
IGNORE_SSL_CONF = "tensorflow.spark.distributor.ignoreSsl"


# How errors name this face, its size argument and its SSL override (the launcher refuses an
# encrypted cluster before any task starts).
FACE = LaunchPlan(
    face="MirroredStrategyRunner", size_argument="num_slots", ignore_ssl_conf=IGNORE_SSL_CONF
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
        options: what hvdflow adds (``LaunchOptions``: ``spark``, ``start_timeout_s``,
            ``stall_timeout_s``, ``log_dir``, ``on_log_line``, ...); its ``engine`` is always
            ``tf_collective`` here.

    Inside ``train_fn``, ``pyspark.BarrierTaskContext.get()`` answers as in the Spark task that
    runs the worker (``allGather``, ``barrier``, ``partitionId``, ``getTaskInfos``,
    ``resources``), as in the original; in local mode there is no barrier task, as there.

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
        **moved: Any,
    ):
        options = checked_options(
            options, "MirroredStrategyRunner", f"num_slots={num_slots!r}", moved
        )
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
        self._options = face_options(options, FACE, engine=_wire.TF_COLLECTIVE)
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
        if self.local_mode:
            self._runner = self._local_runner()
        else:
            self._runner = self._cluster_runner()
        return self._runner.run(main, **kwargs)

    def _cluster_runner(self) -> HorovodRunner:
        tasks = self._num_tasks
        per_task = split_evenly(self.num_slots, tasks) if self.use_gpu else [0] * tasks
        plan = dataclasses.replace(
            FACE,
            gpu_plan=GpuPlan(per_task=tuple(per_task), resource_name=self.gpu_resource_name),
            asked=f"num_slots={self.num_slots} ({tasks} Spark tasks)",
        )
        logger.info(
            "MirroredStrategyRunner: %d worker(s) as Spark barrier tasks, %s",
            tasks,
            f"GPUs {'/'.join(map(str, per_task))}" if self.use_gpu else "CPU only",
        )
        return HorovodRunner(np=tasks, options=self._options, _plan=plan)

    def _local_runner(self) -> HorovodRunner:
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
        plan = dataclasses.replace(
            FACE,
            gpu_plan=GpuPlan(
                per_task=(per_task,), resource_name=self.gpu_resource_name, driver_gpus=tuple(owned)
            ),
            asked=f"num_slots={self.num_slots} (local mode)",
        )
        return HorovodRunner(np=-1, options=self._options, _plan=plan)

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
