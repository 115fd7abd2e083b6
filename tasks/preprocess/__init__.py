"""Step 1 of the pipeline: raw images to Petastorm Parquet with PySpark.

``job`` runs it (listing, the Spark stage, publishing); ``steps`` is its Prefect task, cached by
the dataset fingerprint; the other modules are what the job is made of (sources, walk, sniff,
decode, pixels, split, schema, write, storage).
"""

from hvdflow.tasks.preprocess.job import DatasetManifest, PreprocessConfig, preprocess_images

__all__ = ["DatasetManifest", "PreprocessConfig", "preprocess_images"]
