"""The barrier launcher: ``HorovodRunner(np=...).run(main, **kwargs)``, and the two other faces.

Split where the processes and the contracts split:

- ``runner``: the public faces, each building one frozen ``LaunchPlan``; ``options``: hvdflow's
  extras to every face; ``errors``: what the runners raise, as classes to catch
- ``_driver``: the driver's process (``Launch``): checks, the tasks' channel, the barrier stage,
  the watch over a run; ``_task``: one Spark barrier task, supervising its rank processes;
  ``_rank``: the rank process's entry point
- ``_wire``: the two contracts, driver <-> task and rank -> task, imported by both ends of each
- ``_engines``: the engines, one row each, and placement (pure functions)
- ``_decisions``: why a rank stops, which failure came first, who went silent (pure functions)
- ``_relay``: the channel through the object store, for tasks that cannot reach the driver;
  ``_rendezvous``: Horovod's Gloo rendezvous, served by rank 0's task, and who may use it

A failure travels ``_rank`` (its exit and last lines) -> ``_task`` (the ``failed`` report) ->
``_driver`` (the first failure, named with its rank and host). Exports are lazy, like
``infra``'s: a rank process imports only what it uses.
"""

from hvdflow.infra._lazy import lazy_exports

# The streams a LogLine comes from: a rank's stdout and stderr, and log_to_driver messages.
STREAMS = ("STDOUT", "STDERR", "CALLBACK")
EXPORTS = {
    "HorovodRunner": "hvdflow.infra.launcher.runner",
    "HorovodOptions": "hvdflow.infra.launcher.options",
    "MirroredStrategyRunner": "hvdflow.infra.launcher.runner",
    "TorchDistributor": "hvdflow.infra.launcher.runner",
    "LaunchOptions": "hvdflow.infra.launcher.options",
    # What the runners raise, as classes a user can catch (the originals raise plain ones).
    "RankFailed": "hvdflow.infra.launcher.errors",
    "SparkJobFailed": "hvdflow.infra.launcher.errors",
    "EncryptionRequired": "hvdflow.infra.launcher.errors",
    "GpuSchedulingNotEnabled": "hvdflow.infra.launcher.errors",
    "TransientError": "hvdflow.infra.errors",
    "LogLine": "hvdflow.infra.launcher._wire",
    "log_to_driver": "hvdflow.infra.launcher._wire",
    "report_progress": "hvdflow.infra.launcher._wire",
    **{stream: "hvdflow.infra.launcher._wire" for stream in STREAMS},
}

__all__ = sorted(EXPORTS)
__getattr__ = lazy_exports(__name__, EXPORTS)
