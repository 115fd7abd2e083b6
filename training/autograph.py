"""Horovod's and Petastorm's TensorFlow functions run in a graph as written: AutoGraph need not
rewrite them.

Inside a ``tf.function``, AutoGraph rewrites the control flow of every function called, except in
the libraries its ``CONVERSION_RULES`` list (TensorFlow, Keras, NumPy, ...). Horovod and Petastorm
were written for TensorFlow 1's graphs and need no rewriting, which cost every rank 1.5 to 2.7
CPU-seconds of ``model.fit`` (the weights train bit for bit the same without it). Two changes:

- functions *called* from a traced function follow the rules: Horovod and Petastorm join them;
- Horovod wraps its allreduce and broadcast in ``tf.function`` itself (``_make_subgraph``), whose
  function AutoGraph always converts: they are traced here with ``autograph=False``.
"""

from __future__ import annotations

HOROVOD = "horovod"
PETASTORM = "petastorm"


def run_horovod_unconverted() -> None:
    """Leave Horovod's functions to run as written (once; before the first ``tf.function`` that
    calls Horovod is traced, and before ``hvd.DistributedOptimizer`` is made)."""
    _do_not_convert(HOROVOD)
    _trace_horovod_subgraphs_as_written()


def run_petastorm_unconverted() -> None:
    """Leave Petastorm's functions to run as written (before its ``tf.data`` dataset is made)."""
    _do_not_convert(PETASTORM)


def _do_not_convert(package: str) -> None:
    from tensorflow.python.autograph.core import config  # AutoGraph's rules have no public API

    rules = config.CONVERSION_RULES
    if any(isinstance(rule, config.DoNotConvert) and rule.matches(package) for rule in rules):
        return
    config.CONVERSION_RULES = (config.DoNotConvert(package), *rules)


def _trace_horovod_subgraphs_as_written() -> None:
    """Horovod's ``_make_subgraph`` (``tf.function(f)``), imported by name into the two modules
    that call it, made ``tf.function(f, autograph=False)``. A Horovod without it is left alone."""
    import horovod.tensorflow as hvd_tf
    import horovod.tensorflow.functions as hvd_functions
    import tensorflow as tf

    def subgraph_as_written(f):
        return tf.function(f, autograph=False)

    for module in (hvd_tf, hvd_functions):
        if callable(getattr(module, "_make_subgraph", None)):
            module._make_subgraph = subgraph_as_written
