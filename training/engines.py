"""What the training function needs from the engine that synchronises its ranks.

Three engines, one shape (``Engine``): rank, size and ranks on the host, the scope to build in,
the optimizer's gradient averaging, the callbacks that keep ranks equal, and the dataset for Keras.

- ``horovod``: ``hvd.DistributedOptimizer`` over Gloo (optionally fp16 on the wire); rank 0's
  variables broadcast after the first batch, validation metrics averaged over ranks.
- ``tf_collective``: ``MultiWorkerMirroredStrategy`` on the launcher's TF_CONFIG. Each rank still
  reads its own shard with its own batch (``distribute_datasets_from_function``, no auto-sharding),
  so both engines train on exactly the same batches.
- ``none``: one plain Keras process, the benchmark's baseline.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
from dataclasses import dataclass, field
from typing import Any

from hvdflow.infra.constants import (
    HOROVOD,
    HOROVOD_LOCAL_SIZE,
    PIPELINE_ENGINES,
    TF_COLLECTIVE,
    TF_CONFIG,
)
from hvdflow.infra.errors import TransientError
from hvdflow.infra.launcher._engines import device_datasets_without_autotuning
from hvdflow.training.autograph import run_horovod_unconverted
from hvdflow.training.threads import share_cores, use_threads

NONE = "none"  # one process, no engine (np=1 outside the launcher)


@dataclass
class Engine:
    name: str
    rank: int = 0
    size: int = 1
    local_size: int = 1
    strategy: Any = None  # the tf.distribute strategy of tf_collective
    fp16_compression: bool = False
    _hvd: Any = field(default=None, repr=False)
    _sum: Any = field(default=None, repr=False)

    def scope(self):
        """Build model and optimizer in here (the strategy's scope for tf_collective)."""
        return self.strategy.scope() if self.strategy is not None else contextlib.nullcontext()

    def optimizer(self, opt):
        if self._hvd is None:
            return opt
        compression = self._hvd.Compression.fp16 if self.fp16_compression else None
        if compression is None:
            return self._hvd.DistributedOptimizer(opt)
        return self._hvd.DistributedOptimizer(opt, compression=compression)

    def callbacks(self) -> list:
        """Callbacks that go first: they make the logs the others read the same on every rank."""
        if self._hvd is None:
            return []
        return [
            self._hvd.callbacks.BroadcastGlobalVariablesCallback(0),
            self._hvd.callbacks.MetricAverageCallback(),  # validation metrics over ranks
        ]

    def sum_over_ranks(self, values: list[float]) -> list[float]:
        """``values`` summed element-wise over every rank; a collective: call it on all ranks."""
        if self._hvd is None and self.strategy is None:
            return [float(v) for v in values]
        import tensorflow as tf

        tensor = tf.constant(values, tf.float64)
        if self._hvd is not None:
            summed = self._hvd.allreduce(tensor, op=self._hvd.Sum, name="hvdflow_sum")
        else:
            summed = self._strategy_sum()(tensor)
        return [float(v) for v in summed.numpy()]

    def _strategy_sum(self):
        """The strategy's all-reduce of a float64 vector as one graph function, traced once:
        called eagerly it sometimes took 1 s instead of 10-30 ms."""
        if self._sum is None:
            import tensorflow as tf

            strategy, sum_ = self.strategy, tf.distribute.ReduceOp.SUM
            device = strategy.extended.worker_devices[0]

            @tf.function(input_signature=[tf.TensorSpec([None], tf.float64)])
            def summed(tensor):
                with tf.device(device):  # a graph input has none: the reduction needs one
                    local = tf.identity(tensor)
                per_replica = strategy.run(
                    lambda: tf.distribute.get_replica_context().all_reduce(sum_, local)
                )
                return strategy.experimental_local_results(per_replica)[0]

            self._sum = summed
        return self._sum

    def distribute(self, dataset):
        """This rank's dataset (already sharded and batched per rank) as Keras takes it."""
        if self.strategy is None:
            return dataset
        return self.strategy.distribute_datasets_from_function(lambda _context: dataset)


def start_engine(name: str, fp16_compression: bool = False, threads: int | None = None) -> Engine:
    """Join the job: ``hvd.init()``, or create the MultiWorkerMirroredStrategy. Call it before
    any TensorFlow op (collectives and threads are set before the runtime starts): ``threads``
    per process, else the ranks on a host share its cores."""
    if name == HOROVOD:
        import horovod.tensorflow.keras as hvd

        run_horovod_unconverted()
        # The launcher gave a rank without a GPU a 10 ms cycle (HOROVOD_CYCLE_TIME).
        hvd.init()
        threads = threads or share_cores(hvd.local_size())
        use_threads(threads)
        return _joined(
            Engine(
                name,
                hvd.rank(),
                hvd.size(),
                hvd.local_size(),
                fp16_compression=fp16_compression,
                _hvd=hvd,
            ),
            threads,
        )
    if name == TF_COLLECTIVE:
        import tensorflow as tf

        local_size = int(os.environ.get(HOROVOD_LOCAL_SIZE, "1"))
        threads = threads or share_cores(local_size)
        use_threads(threads)
        if TF_CONFIG not in os.environ:
            raise RuntimeError(
                "engine 'tf_collective' needs TF_CONFIG: run the training function with "
                "HorovodRunner(np=..., options=LaunchOptions(engine='tf_collective')) or "
                "MirroredStrategyRunner"
            )
        device_datasets_without_autotuning()
        strategy = _multi_worker_strategy(tf)
        rank = int(json.loads(os.environ[TF_CONFIG])["task"]["index"])
        engine = Engine(name, rank, strategy.num_replicas_in_sync, local_size, strategy=strategy)
        return _joined(engine, threads)
    if name == NONE:
        use_threads(threads or share_cores(1))
        return Engine(name)
    known = ", ".join((*PIPELINE_ENGINES, NONE))
    raise ValueError(f"engine {name!r} is unknown to the Keras trainer: expected one of {known}")


def _joined(engine: Engine, threads: int) -> Engine:
    say_joined(engine.rank, engine.size, engine.name, threads)
    return engine


def say_joined(rank: int, size: int, engine: str, threads: int) -> None:
    """Say on stdout that this rank joined, where, with how many threads: each rank's first line
    on the driver (with ``driver_log_verbosity="all"``)."""
    print(  # noqa: T201 (the rank's stdout is streamed to the driver, tagged)
        f"rank {rank} of {size} joined on {socket.gethostname()}: {engine} engine, "
        f"{threads} thread(s)",
        flush=True,
    )


def _multi_worker_strategy(tf):
    """The strategy on this rank's TF_CONFIG. Another program may take the port the launcher
    picked before TensorFlow binds it: a ``TransientError``, so the next attempt picks others."""
    try:
        return tf.distribute.MultiWorkerMirroredStrategy(
            communication_options=tf.distribute.experimental.CommunicationOptions(
                implementation=tf.distribute.experimental.CommunicationImplementation.RING
            )
        )
    except tf.errors.UnknownError as e:
        if "Could not start gRPC server" not in str(e):
            raise
        task = json.loads(os.environ[TF_CONFIG])["task"]
        address = json.loads(os.environ[TF_CONFIG])["cluster"]["worker"][task["index"]]
        raise TransientError(
            f"TensorFlow could not listen on {address} (rank {task['index']}'s port, taken by "
            "another program after the launcher picked it); another attempt picks other ports"
        ) from e
