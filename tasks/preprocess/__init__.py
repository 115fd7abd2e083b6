"""Step 1 of the pipeline: raw images to Petastorm Parquet with PySpark.

``job`` runs it: ``plan`` (the split, the checks and each task's share, from the listing alone),
``stage`` (the Spark stage), ``publish`` (the metadata, reports and manifest). ``config`` holds
what it is asked and what it published; ``steps`` is its Prefect task, cached by the dataset
fingerprint. The rest is what the tasks are made of: ``sources`` and ``walk`` (listing),
``sniff``, ``decode`` and ``pixels`` (one image), ``split``, ``schema``, ``write``, ``storage``.
"""

from hvdflow.tasks.preprocess.config import DatasetManifest, PreprocessConfig
from hvdflow.tasks.preprocess.job import preprocess_images

__all__ = ["DatasetManifest", "PreprocessConfig", "preprocess_images"]
