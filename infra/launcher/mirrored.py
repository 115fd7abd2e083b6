"""MirroredStrategyRunner: spark-tensorflow-distributor's API on hvdflow's barrier launcher.

Databricks deprecated ``spark-tensorflow-distributor``; code written for it moves here by
changing one import::

    from hvdflow import MirroredStrategyRunner  # was: from spark_tensorflow_distributor import ...

    def train():
        import tensorflow as tf
        model = ...            # plain Keras: the runner builds it in the strategy's scope
        model.fit(dataset, epochs=3, steps_per_epoch=5)

    MirroredStrategyRunner(num_slots=2, use_gpu=False).run(train)

Each slot is one barrier task running one TensorFlow worker of a
``tf.distribute.MultiWorkerMirroredStrategy``, with TF_CONFIG from the tasks' addresses
(``HorovodRunner(engine="tf_collective")``): worker 0, the chief, returns the result. On top of
what the original does, the workers' output streams to the driver with rank prefixes, a worker
that dies or hangs fails the run naming it, and no process is left behind.

Differences: ``local_mode=True`` runs ``num_slots`` worker processes on the driver (the original
runs one process with a single-machine MirroredStrategy and refuses more than one CPU slot).
GPUs follow the task's Spark ``gpu`` resource, one per worker, whatever ``gpu_resource_name``
says; ``use_gpu=False`` hides them (CUDA_VISIBLE_DEVICES="").
"""

from __future__ import annotations

import logging
from functools import partial
from typing import Any

from hvdflow.infra.launcher import _wire
from hvdflow.infra.launcher.options import HorovodOptions
from hvdflow.infra.launcher.runner import HorovodRunner

logger = logging.getLogger(__name__)


class MirroredStrategyRunner:
    """Runs a TensorFlow training function on ``num_slots`` workers of a
    MultiWorkerMirroredStrategy, one Spark barrier task each.

    Args:
        num_slots: workers (Spark tasks) that train together; at least 1.
        local_mode: run the workers as processes on the driver instead of Spark tasks.
        use_gpu: let each worker see its task's GPU; False trains on CPU only.
        gpu_resource_name: kept for compatibility (the task's ``gpu`` resource is used).
        use_custom_strategy: ``train_fn`` creates its own strategy; otherwise the runner creates
            a MultiWorkerMirroredStrategy and calls ``train_fn`` inside its scope.
        **launcher_options: HorovodRunner's own (``spark``, ``start_timeout_s``,
            ``stall_timeout_s``, ``log_dir``, ``on_log_line``, ...).
    """

    def __init__(
        self,
        *,
        num_slots: int,
        local_mode: bool = False,
        use_gpu: bool = True,
        gpu_resource_name: str = "gpu",
        use_custom_strategy: bool = False,
        **launcher_options: Any,
    ):
        if isinstance(num_slots, bool) or not isinstance(num_slots, int) or num_slots <= 0:
            raise ValueError(
                f"num_slots={num_slots!r}: expected a positive number of workers (Spark tasks)"
            )
        self.num_slots = num_slots
        self.local_mode = local_mode
        self.use_gpu = use_gpu
        self.gpu_resource_name = gpu_resource_name
        self.use_custom_strategy = use_custom_strategy
        if not use_gpu:
            options = launcher_options.pop("horovod", None) or HorovodOptions()
            hidden = {**options.extra_env, "CUDA_VISIBLE_DEVICES": ""}
            launcher_options["horovod"] = options.model_copy(update={"extra_env": hidden})
        self._runner = HorovodRunner(
            np=-num_slots if local_mode else num_slots,
            engine=_wire.TF_COLLECTIVE,
            **launcher_options,
        )

    @property
    def log_path(self) -> str | None:
        return self._runner.log_path

    def run(self, train_fn, **kwargs: Any) -> Any:
        """``train_fn(**kwargs)`` on every worker; the chief's (worker 0's) return value."""
        main = partial(_in_strategy, train_fn, self.use_custom_strategy)
        logger.info(
            "MirroredStrategyRunner: %d worker(s) %s, %s",
            self.num_slots,
            "on the driver" if self.local_mode else "as Spark barrier tasks",
            "GPU" if self.use_gpu else "CPU only",
        )
        return self._runner.run(main, **kwargs)


def _in_strategy(train_fn, use_custom_strategy: bool, **kwargs: Any) -> Any:
    """Runs in each worker: ``train_fn`` inside a MultiWorkerMirroredStrategy's scope."""
    if use_custom_strategy:
        return train_fn(**kwargs)
    import tensorflow as tf

    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    with strategy.scope():
        return train_fn(**kwargs)
