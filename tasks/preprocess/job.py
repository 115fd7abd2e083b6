"""Step 1: raw images to Petastorm Parquet with PySpark (path in, manifest out).

Layout of one dataset version (``<output>/<fingerprint[:16]>/``)::

    train/            Petastorm dataset (image, label, source, split)
    val/              Petastorm dataset, same schema
    labels.json       class name -> label index
    quarantine.csv    source,reason for every input that was left out
    manifest.json     fingerprint, parameters, counts; written last

A version is built in a temporary folder and renamed into place (uploaded, manifest last, for
``s3://`` outputs), so a job that dies leaves nothing that looks finished. The same fingerprint
reuses the existing version without touching Spark.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import logging
import os
import shutil
import tempfile
import time
from collections import Counter, defaultdict
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from tasks.preprocess import sources

logger = logging.getLogger(__name__)

MANIFEST = "manifest.json"


class PreprocessConfig(BaseModel):
    """What to read, how to turn it into training images, and where to write them."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    input: str
    input_format: Literal["folders", "mnist_idx", "digits"] = "folders"
    output: str = "data/datasets"
    image_size: tuple[int, int] = (28, 28)  # (height, width)
    color_mode: Literal["L", "RGB"] = "L"
    val_fraction: float = Field(default=0.2, ge=0.0, lt=1.0)
    seed: int = 0
    max_pixels: int = Field(default=50_000_000, gt=0)
    max_bad_fraction: float = Field(default=0.1, ge=0.0, le=1.0)
    files_per_split: int = Field(default=8, ge=1)  # row groups to shard across ranks

    def params(self) -> dict:
        """What decides the content besides the input files: part of the fingerprint."""
        return self.model_dump(exclude={"input", "output"})


@dataclass(frozen=True)
class DatasetManifest:
    path: str  # the version's folder (local path or s3:// URI)
    fingerprint: str
    train_url: str
    val_url: str
    train_rows: int
    val_rows: int
    quarantined: int
    label_map: dict[str, int]
    image_shape: tuple[int, ...]
    quarantine_path: str
    reused: bool = False

    @property
    def num_classes(self) -> int:
        return len(self.label_map)


def list_inputs(config: PreprocessConfig) -> sources.Listing:
    if config.input_format == "mnist_idx":
        return sources.list_mnist_idx(config.input)
    root = config.input
    if config.input_format == "digits":
        root = sources.write_digits_tree(config.input)
    return sources.list_class_folders(root)


def preprocess_images(spark, config: PreprocessConfig, store=None) -> DatasetManifest:
    """Decode, convert and resize the input images into a train/val Petastorm dataset."""
    listing = list_inputs(config)
    if not listing.items:
        raise ValueError(
            f"no images found in {config.input!r} ({config.input_format}): expected one "
            "sub-folder per class with image files inside"
        )
    fingerprint = sources.fingerprint(listing, config.params())
    target = _Target(config.output, fingerprint[:16], store)
    existing = target.manifest()
    if existing is not None:
        logger.info(
            "dataset %s is up to date (fingerprint %s): reusing", target.path, fingerprint[:16]
        )
        return DatasetManifest(**{**existing, "reused": True})

    started = time.monotonic()
    with tempfile.TemporaryDirectory(
        prefix="hvdflow-preprocess-", dir=target.staging_root()
    ) as tmp:
        manifest = _build(spark, config, listing, fingerprint, Path(tmp), target)
        target.publish(Path(tmp))
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


def _build(spark, config, listing, fingerprint, workdir: Path, target) -> DatasetManifest:
    from pyspark import StorageLevel

    from tasks.preprocess.decode import Good, decode_item

    sc = spark.sparkContext
    sc.setJobDescription(f"hvdflow preprocess: decoding {len(listing.items)} items")
    partitions = max(1, min(len(listing.items), sc.defaultParallelism * 4))
    image_size, color_mode, max_pixels = config.image_size, config.color_mode, config.max_pixels
    decoded = (
        sc.parallelize(listing.items, partitions)
        .flatMap(lambda item: decode_item(item, image_size, color_mode, max_pixels))
        .persist(StorageLevel.MEMORY_AND_DISK)
    )
    try:
        summary = decoded.map(
            lambda r: (
                (True, r.source, r.label) if isinstance(r, Good) else (False, r.source, r.reason)
            )
        ).collect()
        good = [(source, label) for ok, source, label in summary if ok]
        bad = [(source, reason) for ok, source, reason in summary if not ok]
        _check_quality(config, len(good), bad)

        labels = listing.labels or sorted({label for _, label in good})
        label_map = {name: i for i, name in enumerate(labels)}
        val_sources = stratified_val_sources(good, config.val_fraction, config.seed)
        counts = Counter("val" if s in val_sources else "train" for s, _ in good)

        from tasks.preprocess.schema import image_schema, image_shape

        schema = image_schema(config.image_size, config.color_mode)
        val_broadcast = sc.broadcast(val_sources)
        for split in ("train", "val"):
            sc.setJobDescription(f"hvdflow preprocess: writing {counts[split]} {split} rows")
            rows = decoded.filter(
                lambda r, split=split: (
                    isinstance(r, Good) and (r.source in val_broadcast.value) == (split == "val")
                )
            )
            _write_petastorm(spark, schema, rows, label_map, split, workdir / split, config)
        val_broadcast.unpersist()
    finally:
        decoded.unpersist()
        sc.setJobDescription(None)

    (workdir / "labels.json").write_text(json.dumps(label_map, indent=2))
    with open(workdir / "quarantine.csv", "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["source", "reason"])
        writer.writerows(sorted(bad))
    manifest = DatasetManifest(
        path=target.path,
        fingerprint=fingerprint,
        train_url=target.url("train"),
        val_url=target.url("val"),
        train_rows=counts["train"],
        val_rows=counts["val"],
        quarantined=len(bad),
        label_map=label_map,
        image_shape=image_shape(config.image_size, config.color_mode),
        quarantine_path=target.join("quarantine.csv"),
    )
    record = {**asdict(manifest), "params": config.params(), "input": config.input}
    (workdir / MANIFEST).write_text(json.dumps(record, indent=2))
    return manifest


def _check_quality(config: PreprocessConfig, good: int, bad: list[tuple[str, str]]) -> None:
    total = good + len(bad)
    if good == 0:
        reasons = Counter(reason.split(":")[0] for _, reason in bad).most_common(3)
        raise ValueError(
            f"none of the {total} inputs in {config.input!r} is a usable image (most common "
            f"reasons: {reasons}); check the path and the input_format"
        )
    if bad and len(bad) / total > config.max_bad_fraction:
        examples = "; ".join(f"{s}: {r}" for s, r in bad[:3])
        raise ValueError(
            f"{len(bad)} of {total} inputs ({len(bad) / total:.0%}) are unusable, above "
            f"max_bad_fraction={config.max_bad_fraction:g}; e.g. {examples}. Fix the inputs or "
            "raise max_bad_fraction"
        )
    if bad:
        logger.warning("quarantined %d of %d inputs (see quarantine.csv)", len(bad), total)


def stratified_val_sources(
    good: list[tuple[str, str]], val_fraction: float, seed: int
) -> frozenset[str]:
    """The validation share of every class, chosen by a seeded hash: same input, same split."""
    by_label: dict[str, list[str]] = defaultdict(list)
    for source, label in good:
        by_label[label].append(source)
    chosen: set[str] = set()
    for members in by_label.values():
        members.sort(key=lambda s: hashlib.sha256(f"{seed}:{s}".encode()).hexdigest())
        chosen.update(members[: round(len(members) * val_fraction)])
    return frozenset(chosen)


def _write_petastorm(spark, schema, rows, label_map, split, path: Path, config) -> None:
    from petastorm.etl.dataset_metadata import materialize_dataset
    from petastorm.unischema import dict_to_spark_row

    url = path.resolve().as_uri()
    records = rows.map(
        lambda r: dict_to_spark_row(
            schema,
            {"image": r.image, "label": label_map[r.label], "source": r.source, "split": split},
        )
    )
    with materialize_dataset(spark, url, schema, row_group_size_mb=64):
        frame = spark.createDataFrame(records, schema.as_spark_schema())
        frame.repartition(config.files_per_split).write.mode("overwrite").parquet(url)


class _Target:
    """Where a dataset version lives: a local folder, or an s3:// prefix in the object store."""

    def __init__(self, output: str, version: str, store):
        self.remote = output.startswith("s3://")
        self.path = (
            f"{output.rstrip('/')}/{version}"
            if self.remote
            else str(Path(output).resolve() / version)
        )
        self.store = store
        if self.remote and store is None:
            from infra.storage.object_store import ObjectStore

            self.store = ObjectStore()

    def join(self, name: str) -> str:
        return f"{self.path}/{name}" if self.remote else str(Path(self.path) / name)

    def url(self, split: str) -> str:
        return self.join(split) if self.remote else Path(self.path, split).as_uri()

    def staging_root(self) -> str | None:
        if self.remote:
            return None
        # Same file system as the final folder, so the rename is atomic.
        root = Path(self.path).parent
        root.mkdir(parents=True, exist_ok=True)
        return str(root)

    def manifest(self) -> dict | None:
        if self.remote:
            uri = self.join(MANIFEST)
            if self.store.head(uri) is None:
                return None
            record = json.loads(self.store.get_bytes(uri))
        else:
            path = Path(self.path, MANIFEST)
            if not path.exists():
                return None
            record = json.loads(path.read_text())
        fields = DatasetManifest.__dataclass_fields__
        record = {k: v for k, v in record.items() if k in fields}
        record["image_shape"] = tuple(record["image_shape"])
        return record

    def publish(self, built: Path) -> None:
        if not self.remote:
            final = Path(self.path)
            if final.exists():  # an unfinished earlier attempt: no manifest, so never used
                shutil.rmtree(final)
            os.rename(built, final)
            built.mkdir()  # TemporaryDirectory wants something to delete
            return
        files = sorted(p for p in built.rglob("*") if p.is_file() and p.name != MANIFEST)
        for path in files:
            self.store.upload_file(str(path), self.join(str(path.relative_to(built))))
        # The manifest goes last: its presence means the upload is complete.
        buffer = io.BytesIO((built / MANIFEST).read_bytes())
        self.store.put_bytes(buffer.getvalue(), self.join(MANIFEST))
