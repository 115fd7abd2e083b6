"""The model in each executor process: loaded once, kept for every later batch and task.

PySpark reuses its Python workers between tasks, so a module-level cache lives as long as the
worker. Keyed by the model's URI and its MLmodel id, so a version registered again elsewhere
under the same number is not mistaken for the cached one. Never imports horovod.

What is cached is the model's ``probabilities`` function: the registered ImageClassifier's own
(``hvdflow.serving.classifier``), so a batch prediction is computed as a served one is, or a bare
Keras model's ``predict_on_batch``.
"""

from __future__ import annotations

import logging
import os
import sys
from collections import OrderedDict

from hvdflow.serving.classifier import autograph_modules, forget_sources
from hvdflow.training.threads import use_threads

logger = logging.getLogger(__name__)

# The newest few: a long-lived worker scoring version after version keeps not every one.
KEEP = 2

_models: OrderedDict[tuple[str, str], object] = OrderedDict()
_loads = 0
_threads_set = False


def loads() -> int:
    """How many times this process has loaded a model."""
    return _loads


def cached_model(key: tuple[str, str], archive: str, threads: int):
    """The ``probabilities`` function of the model ``key``, loaded from ``archive`` once."""
    global _loads
    model = _models.get(key)
    if model is not None:
        _models.move_to_end(key)
        return model
    _limit_threads(threads)
    from pyspark import SparkFiles

    model = load_probabilities(SparkFiles.get(archive))
    _loads += 1
    _models[key] = model
    while len(_models) > KEEP:
        _models.popitem(last=False)
    logger.info("loaded %s from %s", key[0], archive)
    return model


def load_probabilities(local_dir: str):
    """The probabilities function of the model saved in ``local_dir``."""
    import mlflow.pyfunc
    from mlflow.models import Model

    if "tensorflow" in Model.load(os.path.join(local_dir, "MLmodel")).flavors:
        import mlflow.tensorflow

        return mlflow.tensorflow.load_model(local_dir).predict_on_batch
    return mlflow.pyfunc.load_model(local_dir).unwrap_python_model().probabilities


def _limit_threads(threads: int) -> None:
    """TensorFlow gets the task's cores (``spark.task.cpus``), not the host's: the executor runs
    tasks side by side. Only possible before TensorFlow's first op."""
    global _threads_set
    if _threads_set:
        return

    try:
        use_threads(threads)
    except RuntimeError:  # TensorFlow already ran in this process: keep its settings
        pass
    _threads_set = True


def forget_generated_sources() -> tuple[int, int]:
    """Removes the module files AutoGraph wrote for this process: it removes them only in an
    atexit hook, and PySpark's workers end with os._exit (an ImageClassifier removes its own;
    this covers a bare Keras model's). Returns (modules held, files still on disk)."""
    names = autograph_modules()
    forget_sources(names)
    left = sum(os.path.isfile(getattr(sys.modules.get(n), "__file__", None) or "") for n in names)
    return len(names), left
