"""The barrier launcher: ``HorovodRunner(np=...).run(main, **kwargs)``.

Split where the processes split:

- ``runner``: the public ``HorovodRunner``, on the driver (engine ``horovod``, ``tf_collective``
  or ``torch``)
- ``mirrored``: ``MirroredStrategyRunner``, spark-tensorflow-distributor's API on the same launcher
- ``torch_distributor``: ``TorchDistributor``, pyspark's PyTorch launcher's API on it (engine
  ``torch``: each rank gets torchrun's environment)
- ``options``: ``LaunchOptions``, hvdflow's extras to both runners (timeouts, logs, engine,
  ``HorovodOptions``: Horovod's knobs as each rank's environment)
- ``errors``: what the runners raise, as classes to catch
- ``rank_events``: ``log_to_driver`` and ``report_progress``, called inside a rank
- ``_channel``: the driver's end of the tasks' channel (reports, liveness, progress, stacks)
- ``_rendezvous``: who may use the Gloo rendezvous store on the driver (the guard and its server)
- ``_decisions``: why a rank is stopped, how its exit reads, which failure came first (pure)
- ``_liveness``, ``_stall``: which side went silent, which rank stopped progressing (pure)
- ``_slots``, ``_payload``, ``_spark_errors``, ``_runlog``, ``_encryption``: the driver's checks
  before and records during a run (task slots, the pickled function, Spark's error text, the
  run's log, a cluster that requires encryption)
- ``_task``: one Spark barrier task, supervising its rank processes (one per GPU it holds)
- ``_rank_output``: a rank's stdout, stderr and events as its task reads them
- ``_rank``: the rank process's entry point
- ``_wire``: the messages between tasks and the driver, and between a rank and its task
- ``_placement``: which rank runs where and what it is told (pure functions)

Exports are lazy, like ``infra``'s: a rank process imports only what it uses.
"""

from hvdflow.infra._lazy import lazy_exports

# The streams a LogLine comes from: a rank's stdout and stderr, and log_to_driver messages.
STREAMS = ("STDOUT", "STDERR", "CALLBACK")
EXPORTS = {
    "HorovodRunner": "hvdflow.infra.launcher.runner",
    "HorovodOptions": "hvdflow.infra.launcher.options",
    "MirroredStrategyRunner": "hvdflow.infra.launcher.mirrored",
    "TorchDistributor": "hvdflow.infra.launcher.torch_distributor",
    "LaunchOptions": "hvdflow.infra.launcher.options",
    # What the runners raise, as classes a user can catch (the originals raise plain ones).
    "RankFailed": "hvdflow.infra.launcher.errors",
    "SparkJobFailed": "hvdflow.infra.launcher.errors",
    "EncryptionRequired": "hvdflow.infra.launcher.errors",
    "GpuSchedulingNotEnabled": "hvdflow.infra.launcher.errors",
    "TransientError": "hvdflow.infra.errors",
    "LogLine": "hvdflow.infra.launcher._wire",
    "log_to_driver": "hvdflow.infra.launcher.rank_events",
    "report_progress": "hvdflow.infra.launcher.rank_events",
    **{stream: "hvdflow.infra.launcher._wire" for stream in STREAMS},
}

__all__ = sorted(EXPORTS)
__getattr__ = lazy_exports(__name__, EXPORTS)
