"""What the training function needs from the engine that synchronises its ranks.

Three engines, one shape (``Engine``): where this rank is (rank, size, ranks on its host), the
scope that model and optimizer are built in, how the optimizer averages gradients, the callbacks
that keep ranks equal, and how a rank's dataset is handed to Keras.

- ``horovod``: ``hvd.init()``; ``hvd.DistributedOptimizer`` averages gradients over Gloo
  (optionally compressed to fp16 on the wire); rank 0's variables are broadcast after the first
  batch, validation metrics averaged over ranks.
- ``tf_collective``: ``tf.distribute.MultiWorkerMirroredStrategy`` on the TF_CONFIG the launcher
  gave the rank; variables are created equal (the chief's initial values) and every step's
  gradients all-reduced by TensorFlow's CollectiveAllReduce, metrics aggregated by Keras. Each
  rank still reads its own shard with its own per-rank batch, through
  ``distribute_datasets_from_function``: no auto-sharding and no rebatching, so both engines
  train on exactly the same batches.
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
        """``values`` summed element-wise over every rank (call it on all ranks, in the same
        order, as any collective): Horovod's allreduce, or the strategy's all-reduce."""
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
        """The strategy's all-reduce of a float64 vector as one graph function, traced once.

        Called eagerly (``strategy.run`` outside a function), the same all-reduce took 1.0 s
        instead of 0.01-0.03 on one rank or the other in about 40% of the interval evaluations
        on TensorFlow 2.21 (2 ranks, 33 evaluations); traced once, none of 21 did after the
        first (measured 2026-11-29; the study is in BENCHMARKS.md's git history)."""
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
    """Join the job: ``hvd.init()``, or create the MultiWorkerMirroredStrategy.

    Call first, before any TensorFlow op: TensorFlow's collectives must be configured before
    its runtime starts. Threads are limited here too: ``threads`` per process, else the ranks
    on a host share its cores (a plain process gets them all).
    """
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
    """Say on stdout that this rank joined, where, and with how many threads: the first line
    each rank shows on the driver (with ``driver_log_verbosity="all"``), as mpirun's output
    has one from every rank."""
    print(  # noqa: T201 (the rank's stdout is streamed to the driver, tagged)
        f"rank {rank} of {size} joined on {socket.gethostname()}: {engine} engine, "
        f"{threads} thread(s)",
        flush=True,
    )


def _multi_worker_strategy(tf):
    """The strategy on this rank's TF_CONFIG. Its gRPC server listens on the port the launcher
    picked a moment before; another program may take that port in between (nothing can hold
    it for TensorFlow). That is a ``TransientError``: the attempt ends and the next one picks
    other ports, instead of the training failing."""
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
