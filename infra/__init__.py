"""Engines and services the pipeline steps run on.

- ``infra.launcher``: the barrier launcher (``HorovodRunner``) and what runs in its tasks and ranks
- ``infra.services``: the embedded SeaweedFS, MLflow and Prefect servers (``hvdflow up``)
- ``infra.storage``: the S3 object store client and machine-wide locks
- ``infra.spark``: the Spark session hvdflow runs on
- ``infra.tracking``: where MLflow runs are tracked
- ``infra.constants``: every environment variable and Spark conf key, named once

Exports are lazy: rank processes import ``infra.launcher._rank`` and should not pay for
importing Spark.
"""

from infra import launcher as _launcher  # cheap: its own exports are lazy too
from infra._lazy import lazy_exports

# The launcher's public API, and the Spark session helper.
_EXPORTS = {
    name: module for name, module in _launcher.EXPORTS.items() if name not in _launcher.STREAMS
}
_EXPORTS["get_spark"] = "infra.spark"

__all__ = sorted(_EXPORTS)
__getattr__ = lazy_exports(__name__, _EXPORTS)
