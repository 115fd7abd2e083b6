"""Step 1: raw images to Petastorm Parquet with PySpark (path in, manifest out).

Layout of one dataset version (``<output>/<fingerprint[:16]>/``, a local folder every executor
sees, or an ``s3://`` prefix)::

    manifest.json                   written last: the attempt that is the dataset, its URLs
    attempt-<UTC time>-<random>/    everything one attempt wrote
        train/part-NNNNN.parquet    Petastorm dataset (image, label, source, split), written by
        train/_common_metadata        the executors; its metadata by the driver, after them
        val/...                     the same for validation
        labels.json                 class name -> label index
        quarantine.csv              source,reason for every input that was left out

A run that dies leaves an attempt no manifest names (publish.py); the same fingerprint reuses
the published version without touching Spark. The driver lists the inputs and plans the split
and row groups (plan.py); one Spark stage decodes and writes every image (stage.py, write.py).
The driver never holds an image or a row: no shuffle, no collect. The stage is a plain
``mapPartitions``, not ``mapInArrow``: with paths in and a few tuples out, a DataFrame only adds
JVM planning and Arrow conversions (10-13% slower).
"""

from __future__ import annotations

import logging
import time
from contextlib import nullcontext

from hvdflow.infra.spark import SparkProgress
from hvdflow.infra.storage.access import S3Access
from hvdflow.infra.storage.attempts import new_attempt
from hvdflow.infra.storage.files import Location
from hvdflow.infra.storage.uris import is_s3, join
from hvdflow.tasks.images.listing import (
    Listing,
    list_class_folders,
    list_mnist_idx,
    list_s3_class_folders,
)
from hvdflow.tasks.preprocess import sources
from hvdflow.tasks.preprocess.config import DatasetManifest, PreprocessConfig
from hvdflow.tasks.preprocess.plan import check_listed, check_ranks, check_reused, plan_split
from hvdflow.tasks.preprocess.publish import read_manifest
from hvdflow.tasks.preprocess.stage import run_stage

logger = logging.getLogger(__name__)


def list_inputs(config: PreprocessConfig, access: S3Access | None = None) -> Listing:
    if is_s3(config.input):
        access = access or S3Access.from_env()
        if config.input_format == "mnist_idx":
            return list_mnist_idx(config.input, access)
        return list_s3_class_folders(config.input, access)
    if config.input_format == "mnist_idx":
        return list_mnist_idx(config.input)
    root = config.input
    if config.input_format == "digits":
        root = sources.write_digits_tree(config.input)
    return list_class_folders(root)


def preprocess_reported(start_spark, config: PreprocessConfig, report) -> DatasetManifest:
    """``preprocess_images`` logged to ``report`` (the orchestrator's run logger).
    ``start_spark`` is called only when there is a dataset to make: a reuse starts no JVM."""
    report.info("preprocessing %s (%s) into %s", config.input, config.input_format, config.output)
    manifest = preprocess_images(start_spark, config, progress=report)
    report.info(
        "dataset %s: %d train, %d val, %d quarantined%s",
        manifest.path,
        manifest.train_rows,
        manifest.val_rows,
        manifest.quarantined,
        " (reused)" if manifest.reused else "",
    )
    return manifest


def preprocess_images(
    spark, config: PreprocessConfig, store=None, *, progress=None
) -> DatasetManifest:
    """Decode, convert and resize the input images into a train/val Petastorm dataset.

    ``spark``: the Spark session, or a function that returns it when there is work for it.
    ``store`` (an ObjectStore): the endpoint for ``s3://`` paths (default: the AWS variables).
    ``progress``: a logger that follows the Spark stage.
    """
    uses_s3 = is_s3(config.input) or is_s3(config.output)
    access = S3Access.from_env(store) if uses_s3 else None
    listing = list_inputs(config, access)
    check_listed(config, listing)
    fingerprint = sources.fingerprint(listing, config.params())
    version = Location(join(config.output, fingerprint[:16]), access)
    existing = read_manifest(version)
    if existing is not None:
        check_reused(config, existing)
        logger.info(
            "dataset %s is up to date (fingerprint %s): reusing", version.base, fingerprint[:16]
        )
        return existing
    split = plan_split(config, listing, access)
    check_ranks(config, *split.totals())

    session = spark() if callable(spark) else spark
    started = time.monotonic()
    attempt = new_attempt()
    with SparkProgress(session, progress) if progress else nullcontext():
        manifest = run_stage(session, config, listing, split, fingerprint, version, attempt)
    logger.info(
        "preprocessed %d images into %s in %.1f s (%d train, %d val, %d quarantined)",
        manifest.train_rows + manifest.val_rows,
        manifest.path,
        time.monotonic() - started,
        manifest.train_rows,
        manifest.val_rows,
        manifest.quarantined,
    )
    return manifest
