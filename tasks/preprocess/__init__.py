"""Step 1 of the pipeline: raw images to Petastorm Parquet with PySpark.

``job`` runs it: ``plan`` (from the listing alone), ``stage`` (the Spark stage), ``publish``
(metadata, reports, manifest); ``decode``, ``split``, ``schema`` and ``write`` are what the tasks
are made of; ``sources`` fingerprints a dataset. Exports are lazy: the flows' parameters import
``config`` without loading Spark or Petastorm.
"""

from hvdflow.infra._lazy import lazy_exports

_EXPORTS = {
    "DatasetManifest": "hvdflow.tasks.preprocess.config",
    "PreprocessConfig": "hvdflow.tasks.preprocess.config",
    "preprocess_images": "hvdflow.tasks.preprocess.job",
}

__all__ = sorted(_EXPORTS)
__getattr__ = lazy_exports(__name__, _EXPORTS)
