"""Batch scoring with a registered model on Spark (inputs and model in, published output out).

The driver lists the inputs, checks that the model fits them, ships the model once
(``addArchive``) and runs one ``mapInPandas`` stage over (source, path, row_group) rows, an even
share of images per task. Each executor process keeps the model loaded (model_cache.py); the
tasks write the predictions (executor.py) and return report rows, which the driver checks before
it publishes the attempt (publish.py).
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
import time
import zipfile
from collections import Counter
from dataclasses import dataclass, field

from hvdflow.infra.connect import is_connect
from hvdflow.infra.spark_map import default_parallelism, job_description, slices_frame
from hvdflow.infra.storage.access import S3Access
from hvdflow.infra.storage.attempts import new_attempt
from hvdflow.infra.storage.files import Location
from hvdflow.infra.storage.uris import is_s3, join
from hvdflow.tasks.images.fetch import executor_errors
from hvdflow.tasks.images.partitions import assign_partitions
from hvdflow.tasks.images.quarantine import check_quality, write_quarantine
from hvdflow.tasks.score import publish
from hvdflow.tasks.score.config import ScoreConfig
from hvdflow.tasks.score.executor import INPUT_SCHEMA, REPORT_SCHEMA, ExecutorPlan, score_partition
from hvdflow.tasks.score.inputs import ScoreInput, list_input
from hvdflow.tasks.score.model import ScoringModel, image_settings

logger = logging.getLogger(__name__)

# Images per task at most: bigger inputs get more waves, so a failed task redoes a bounded share.
PARTITION_IMAGES = 20_000
# Model archives this driver already gave Spark: (application id, cache key) -> archive name.
_shipped: dict[tuple[str, tuple[str, str]], str] = {}


@dataclass
class ScoreResult:
    output: str
    predictions_url: str
    attempt: str
    model_uri: str
    scored: int
    quarantined: int
    counts: dict[str, int]  # class name -> images predicted as it
    quarantine_path: str
    seconds: float
    executors: list[dict] = field(default_factory=list)  # host, pid, loads, horovod, autograph_*
    milliseconds: dict[str, int] = field(default_factory=dict)  # where the tasks' time went

    @property
    def images_per_s(self) -> float:
        return self.scored / self.seconds if self.seconds else 0.0


def score_images(spark, config: ScoreConfig, model: ScoringModel) -> ScoreResult:
    """Score ``config.input`` with ``model``; publish the predictions at ``config.output``."""
    if not config.output:
        raise ValueError("output is empty: give the folder or s3:// prefix for the predictions")
    uses_s3 = is_s3(config.input) or is_s3(config.output)
    access = S3Access.from_env() if uses_s3 else None
    listing = list_input(config.input, config.input_format, access)
    if all(unit.problem for unit in listing.units):
        first = next(iter(listing.units), None)
        found = f" (only unusable entries, e.g. {first.source}: {first.problem})" if first else ""
        raise ValueError(f"no images found in {config.input!r} ({config.input_format}){found}")
    # Before any Spark work: the model must take these images.
    image_size, color_mode = image_settings(
        model, config.image_size, config.color_mode, listing.stored_shape
    )
    location = Location(config.output, access)
    attempt = new_attempt()

    plan = ExecutorPlan(
        model_key=model.cache_key,
        archive=ship_model(spark, model),
        labels=model.labels,
        image_size=image_size,
        color_mode=color_mode,
        max_pixels=config.max_pixels,
        batch_size=config.batch_size,
        root=listing.root,
        attempt_url=location.join(attempt),
        access=location.access if uses_s3 else None,
    )
    started = time.perf_counter()
    rows = _run(spark, listing, plan, config)
    report = _Report.of(rows)
    try:
        check_quality(config, report.good, report.bad, report.reasons, report.examples)
        _check_visible(location, attempt, report)
    except ValueError:
        publish.discard(location, attempt)  # every task has ended: nothing writes there
        raise
    attempt_dir = Location(location.join(attempt), location.access)
    quarantine = write_quarantine(attempt_dir, report.quarantine_parts)
    counts = {model.labels[int(i)]: n for i, n in sorted(report.classes.items(), key=_index)}
    result = ScoreResult(
        output=location.base,
        predictions_url=join(location.join(attempt), "predictions"),
        attempt=attempt,
        model_uri=model.uri,
        scored=report.good,
        quarantined=report.bad,
        counts=counts,
        quarantine_path=quarantine,
        seconds=0.0,
        executors=report.executors,
        milliseconds=dict(report.milliseconds),
    )
    publish.publish(location, attempt, _manifest(config, model, image_size, color_mode, result))
    result.seconds = time.perf_counter() - started
    logger.info(
        "scored %d images with %s into %s in %.1f s (%d quarantined)",
        result.scored,
        model.uri,
        result.predictions_url,
        result.seconds,
        result.quarantined,
    )
    return result


def _index(item) -> int:
    return int(item[0])


def _manifest(config, model: ScoringModel, image_size, color_mode, result) -> dict:
    return {
        "predictions_url": result.predictions_url,
        "attempt": result.attempt,
        "model": {
            "name": model.name,
            "version": model.version,
            "uri": model.uri,
            "run_id": model.run_id,
            "aliases": list(model.aliases),
        },
        "input": config.input,
        "input_format": config.input_format,
        "image_size": list(image_size),
        "color_mode": color_mode,
        "rows": result.scored,
        "quarantined": result.quarantined,
        "quarantine_path": result.quarantine_path,
        "counts": result.counts,
        "executors": result.executors,
        "created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


# --- the Spark job ---------------------------------------------------------------------------


def partitions_for(images: int, units: int, slots: int) -> int:
    """One wave of tasks, more only to keep each under PARTITION_IMAGES; at most ``units``."""
    waves = max(1, math.ceil(images / PARTITION_IMAGES / max(1, slots)))
    return max(1, min(units, max(1, slots) * waves))


def _run(spark, listing: ScoreInput, plan, config: ScoreConfig) -> list:
    partitions = partitions_for(listing.rows, len(listing.units), default_parallelism(spark))
    assigned = assign_partitions([unit.rows for unit in listing.units], partitions)
    planned: list[list[tuple]] = [[] for _ in range(partitions)]
    for unit, p in zip(listing.units, assigned, strict=True):
        planned[p].append((unit.source, unit.path, unit.row_group, unit.problem))

    def score(batches):
        return score_partition(batches, plan)

    # One stage over the planned units, on a classic session or through Spark Connect.
    frame = slices_frame(spark, planned, INPUT_SCHEMA).mapInPandas(score, REPORT_SCHEMA)
    job_description(spark, f"hvdflow score: {listing.rows} images from {config.input}")
    try:
        with executor_errors():
            return frame.collect()
    finally:
        job_description(spark, None)


def ship_model(spark, model: ScoringModel) -> str:
    """The model's archive name on the executors; zipped and added once per application
    (``sc.addArchive``) or Spark Connect session (``addArtifacts``)."""
    connect = is_connect(spark)
    key = (spark.session_id if connect else spark.sparkContext.applicationId, model.cache_key)
    if key in _shipped:
        return _shipped[key]
    safe = re.sub(r"[^A-Za-z0-9_.-]", "_", model.name)
    name = f"hvdflow-model-{safe}-v{model.version}-{(model.model_uuid or 'local')[:8]}"
    # Beside the downloaded model (its cache folder), made once: complete, or not there.
    path = os.path.join(os.path.dirname(os.path.abspath(model.local_dir)), f"{name}.zip")
    if not os.path.exists(path):
        partial = f"{path}.partial-{os.getpid()}"
        # Stored, not deflated: SavedModel variables hardly compress, and the copy stays local.
        with zipfile.ZipFile(partial, "w", zipfile.ZIP_STORED) as archive:
            for folder, _dirs, files in os.walk(model.local_dir):
                for file_name in files:
                    full = os.path.join(folder, file_name)
                    archive.write(full, os.path.relpath(full, model.local_dir))
        os.replace(partial, path)
    if connect:
        spark.addArtifacts(f"{path}#{name}", archive=True)
    else:
        spark.sparkContext.addArchive(f"{path}#{name}")
    _shipped[key] = name
    return name


# --- what the tasks reported -----------------------------------------------------------------


@dataclass
class _Report:
    files: dict[str, int]  # predictions part file -> rows
    classes: Counter  # class index (str) -> rows
    quarantine_parts: list[str]
    bad: int
    reasons: Counter
    examples: list[tuple[str, str]]
    executors: list[dict]
    milliseconds: Counter

    @classmethod
    def of(cls, rows) -> _Report:
        files, classes, parts, reasons, examples = {}, Counter(), [], Counter(), []
        processes: dict[tuple[str, int], dict] = {}
        milliseconds: Counter = Counter()
        bad = 0
        for kind, name, count in rows:
            if kind == "predictions":
                files[name] = count
            elif kind == "class":
                classes[name] += count
            elif kind == "quarantine":
                parts.append(name)
                bad += count
            elif kind == "reason":
                reasons[name] += count
            elif kind == "example":
                examples.append(tuple(name.split("\0", 1)))
            elif kind == "process":
                info = json.loads(name)
                key = (info["host"], info["pid"])
                if key not in processes or info["loads"] > processes[key]["loads"]:
                    processes[key] = info
            elif kind == "milliseconds":
                milliseconds[name] += count
        executors = [processes[k] for k in sorted(processes)]
        return cls(
            files, classes, sorted(parts), bad, reasons, sorted(examples), executors, milliseconds
        )

    @property
    def good(self) -> int:
        return sum(self.files.values())


def _check_visible(location: Location, attempt: str, report: _Report) -> None:
    """A local output must be a folder every executor shares with the driver."""
    if is_s3(location.base):
        return
    missing = [
        name
        for name in report.files
        if not os.path.exists(location.join(attempt, "predictions", name))
    ]
    if missing:
        hosts = sorted({e["host"] for e in report.executors})
        raise ValueError(
            f"the executors ({', '.join(hosts)}) wrote {len(missing)} prediction files that "
            f"the driver does not see in {location.base!r} (e.g. {missing[0]}): on a cluster "
            "the output must be a shared folder mounted at the same path, or s3://bucket/prefix"
        )
