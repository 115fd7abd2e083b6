"""Step 1 of the pipeline: raw images to Petastorm Parquet with PySpark.

``job`` runs it: ``plan`` (the split, the checks and each task's share, from the listing alone),
``stage`` (the Spark stage), ``publish`` (the metadata, reports and manifest). ``config`` holds
what it is asked and what it published; ``sources`` fingerprints a dataset (an orchestrator's
cache key). The rest is what the tasks are made of: ``decode`` (an item to a
row), ``split``, ``schema``, ``write``. Listing, fetching and decoding the input images is
``hvdflow.tasks.images``', shared with scoring.

Exports are lazy: the flows' parameters import ``config`` without loading Spark or Petastorm.
"""

from hvdflow.infra._lazy import lazy_exports

_EXPORTS = {
    "DatasetManifest": "hvdflow.tasks.preprocess.config",
    "PreprocessConfig": "hvdflow.tasks.preprocess.config",
    "preprocess_images": "hvdflow.tasks.preprocess.job",
}

__all__ = sorted(_EXPORTS)
__getattr__ = lazy_exports(__name__, _EXPORTS)
