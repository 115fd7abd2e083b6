"""Step 1 of the pipeline: raw images to Petastorm Parquet with PySpark."""

from hvdflow.tasks.preprocess.job import DatasetManifest, PreprocessConfig, preprocess_images

__all__ = ["DatasetManifest", "PreprocessConfig", "preprocess_images"]
