"""Engines and services the pipeline steps run on.

- ``hvdflow.infra.launcher``: the barrier launcher (``HorovodRunner``), its tasks and ranks
- ``hvdflow.infra.services``: the embedded SeaweedFS, MLflow and Prefect servers (``hvdflow up``)
- ``hvdflow.infra.storage``: the S3 object store client and machine-wide locks
- ``hvdflow.infra.spark``: the Spark session hvdflow runs on
- ``hvdflow.infra.tracking``: where MLflow runs are tracked
- ``hvdflow.infra.constants``: every environment variable and Spark conf key, named once

Exports are lazy: rank processes import ``hvdflow.infra.launcher._rank`` and should not pay for
importing Spark.
"""

from hvdflow.infra import launcher as _launcher  # cheap: its own exports are lazy too
from hvdflow.infra._lazy import lazy_exports

# The launcher's public API, and the Spark session helper.
_EXPORTS = {
    name: module for name, module in _launcher.EXPORTS.items() if name not in _launcher.STREAMS
}
_EXPORTS["get_spark"] = "hvdflow.infra.spark"

__all__ = sorted(_EXPORTS)
__getattr__ = lazy_exports(__name__, _EXPORTS)
