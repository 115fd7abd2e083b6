"""Engines and services the pipeline steps run on: Spark, the barrier launcher, storage, MLflow.

Exports are lazy: rank processes import ``infra._rank_bootstrap`` and should not pay for
importing Spark.
"""

from importlib import import_module

_EXPORTS = {
    "HorovodRunner": "infra.horovod_runner",
    "HorovodOptions": "infra.horovod_options",
    "log_to_driver": "infra.driver_log",
    "get_spark": "infra.spark",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name):
    if name in _EXPORTS:
        return getattr(import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'infra' has no attribute {name!r}")
