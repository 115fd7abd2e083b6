"""Horovod's and Petastorm's TensorFlow functions run in a graph as written: AutoGraph need not
rewrite them.

Inside a ``tf.function``, AutoGraph rewrites the Python control flow of every function called,
except in the libraries that its own rules list as written for graphs (TensorFlow, Keras, NumPy,
pandas: ``CONVERSION_RULES``). Horovod and Petastorm are not on that list, so every rank of every
run rewrote, statement by statement, Horovod's allreduce functions at its first Keras step and
Petastorm's row-to-tensor functions when it opened its dataset. They need no rewriting: both
were written for TensorFlow 1's graphs, where AutoGraph does not exist (their branches test
Python values, or call ``tf.cond`` themselves).

Two ways in, two changes:

- functions *called* from a traced function follow the rules: Horovod and Petastorm join them;
- Horovod also wraps its allreduce and broadcast in ``tf.function`` itself (``_make_subgraph``),
  and AutoGraph always converts the function a ``tf.function`` wraps. Horovod calls those very
  functions without any ``tf.function`` when TensorFlow runs a graph: they are traced here with
  ``autograph=False``, as written.

Measured with two ranks (``HorovodRunner(np=-2)``, 2 epochs, hvd.DistributedOptimizer), the
weights trained bit for bit the same each time:

- the rule for Horovod: ``model.fit`` took 0.9 to 1.7 CPU-seconds less per rank (digits_mlp 2.3-3.1
  against 1.3-1.4, mnist_cnn 3.3-3.7 against 2.4-2.5);
- then the subgraphs, Petastorm's functions and the reader's own map functions (marked
  ``do_not_convert`` in ``training.reader``): 0.6 to 1 CPU-second less per rank again (CPU of
  both ranks together: digits_mlp 8.8 against 7.5-7.6, mnist_cnn 14.6-15.1 against 12.5-13.3).
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
