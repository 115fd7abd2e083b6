"""hvdflow: Spark-to-deep-learning pipelines on Prefect or Airflow.

Everything hvdflow installs lives under this one name, so that a project's own ``tasks.py`` or
``flows/`` (Prefect's usual layout) cannot hide it. The public API reads like the tools it
stands in for::

    from hvdflow import HorovodRunner            # was: from sparkdl import HorovodRunner
    from hvdflow import MirroredStrategyRunner   # was: from spark_tensorflow_distributor import ...
    from hvdflow import TorchDistributor         # was: from pyspark.ml.torch.distributor import ...
    from hvdflow import score_udf                # like pyspark.ml.functions.predict_batch_udf

The rooms below, lowest first; each imports only from the ones before it:

- ``hvdflow.serving``: what travels inside the registered model (the image code, the pyfunc)
- ``hvdflow.infra``: Spark, the barrier launcher, the embedded servers, object storage
- ``hvdflow.training``: what runs inside each rank (models, reader, callbacks, optimizers)
- ``hvdflow.tasks``: the pipeline's steps (preprocess, stage weights, train, register, score),
  plain functions that know no orchestrator
- ``hvdflow.bench``: the benchmark's conditions and statistics
- ``hvdflow.flows``: the Prefect flows and the ``hvdflow`` command line; each orchestrator's
  face over the steps (``flows.prefect``, ``flows.airflow``)

Exports are lazy: ``import hvdflow`` costs nothing, and a rank process that imports
``hvdflow.training`` never pays for Spark.
"""

import importlib.util
import os
from typing import TYPE_CHECKING

from hvdflow.infra import _EXPORTS as _INFRA_EXPORTS
from hvdflow.infra._lazy import lazy_exports

if TYPE_CHECKING:  # what the lazy exports are, for type checkers and editors (never run)
    from hvdflow.infra.errors import TransientError as TransientError
    from hvdflow.infra.launcher._wire import LogLine as LogLine
    from hvdflow.infra.launcher._wire import log_to_driver as log_to_driver
    from hvdflow.infra.launcher._wire import report_progress as report_progress
    from hvdflow.infra.launcher.errors import EncryptionRequired as EncryptionRequired
    from hvdflow.infra.launcher.errors import GpuSchedulingNotEnabled as GpuSchedulingNotEnabled
    from hvdflow.infra.launcher.errors import RankFailed as RankFailed
    from hvdflow.infra.launcher.errors import SparkJobFailed as SparkJobFailed
    from hvdflow.infra.launcher.options import HorovodOptions as HorovodOptions
    from hvdflow.infra.launcher.options import LaunchOptions as LaunchOptions
    from hvdflow.infra.launcher.runner import HorovodRunner as HorovodRunner
    from hvdflow.infra.launcher.runner import MirroredStrategyRunner as MirroredStrategyRunner
    from hvdflow.infra.launcher.runner import TorchDistributor as TorchDistributor
    from hvdflow.infra.spark import get_spark as get_spark
    from hvdflow.tasks.score.udf import score_udf as score_udf


# hvdflow's training code is Keras 2. TensorFlow 2.16+ ship Keras 3 as tf.keras and Keras 2 as
# tf-keras (a requirement), which tf.keras becomes when this variable is set before tf.keras is
# first touched; rank processes inherit it. TensorFlow 2.15 (the classic profile) has Keras 2
# built in: tf-keras 2.15 is there too, but Horovod's Keras layer and every model saved on that
# stack use the built-in one, so nothing is set. tf-keras's minor is TensorFlow's, and reading
# its version costs milliseconds where importing TensorFlow costs seconds. A user's own value wins.
def _legacy_keras_needed() -> bool:
    from importlib.metadata import PackageNotFoundError, version  # noqa: PLC0415

    if importlib.util.find_spec("tf_keras") is None:
        return False
    try:
        major, minor = (int(part) for part in version("tf-keras").split(".")[:2])
    except (PackageNotFoundError, ValueError):  # a source checkout of tf-keras: assume 2.16+
        return True
    return (major, minor) >= (2, 16)


if _legacy_keras_needed():
    os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

_EXPORTS = dict(_INFRA_EXPORTS)
# Registry consumers: score a DataFrame's column of images with a registered version.
_EXPORTS["score_udf"] = "hvdflow.tasks.score.udf"

__all__ = sorted(_EXPORTS)
_exported = lazy_exports(__name__, _EXPORTS)


def __getattr__(name: str):
    if name == "__version__":  # read when asked for (hvdflow.infra.version says why)
        from hvdflow.infra.version import package_version  # noqa: PLC0415

        return package_version()
    return _exported(name)
