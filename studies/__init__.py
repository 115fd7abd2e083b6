"""One-off studies: side-by-side measurements behind the figures of docs/benchmarks/*.md.

Not part of the wheel: run them from a checkout, as those pages write beside each figure
(``.venv/bin/python -m studies.<name>``). They import hvdflow like any user's script.
"""

import sys

import cloudpickle

# The studies are not installed: a rank or a Spark worker could not import their functions by
# name, so both of the picklers that ship functions to them carry the studies' code by value.
cloudpickle.register_pickle_by_value(sys.modules[__name__])
try:
    from pyspark import cloudpickle as _spark_cloudpickle
except ImportError:  # pragma: no cover (Spark is in every profile)
    pass
else:
    _spark_cloudpickle.register_pickle_by_value(sys.modules[__name__])
