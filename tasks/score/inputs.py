"""What to score, listed on the driver: image files, or the row groups of a Parquet dataset.

Image folders are listed as preprocessing lists them (``hvdflow.tasks.images.listing``), plus
the files at the top level: images to score need no class folders. A dataset is listed by its
Parquet footers, one unit of work per row group. No image is read on the driver, except one
when a dataset does not say its image shape.
"""

from __future__ import annotations

import io
import json
import os
from dataclasses import dataclass

import numpy as np

from hvdflow.infra.storage.access import S3Access
from hvdflow.infra.storage.attempts import MANIFEST
from hvdflow.infra.storage.files import Location, list_objects
from hvdflow.infra.storage.uris import is_s3, join, split_s3
from hvdflow.tasks.images.listing import list_class_folders, list_s3_class_folders
from hvdflow.tasks.images.parquet import IMAGE_COLUMN, SOURCE_COLUMN, open_input, read_row_group

WHOLE_FILE = -1  # Unit.row_group of an image file


@dataclass(frozen=True)
class Unit:
    """One row of the scoring job's input: an image file, or a row group of a Parquet file."""

    source: str  # what the predictions and the quarantine report show (row groups: the file)
    path: str  # a local path or an s3:// URI
    row_group: int = WHOLE_FILE
    rows: int = 1
    # Why the listing knows it is unusable (hvdflow.tasks.images.walk): quarantined, never read.
    problem: str | None = None


@dataclass(frozen=True)
class ScoreInput:
    units: list[Unit]
    root: str  # the folder or prefix the executors read from
    stored_shape: tuple[int, ...] | None = None  # a dataset's image shape; None for image files

    @property
    def rows(self) -> int:
        return sum(unit.rows for unit in self.units)


def list_input(path: str, input_format: str, access: S3Access | None) -> ScoreInput:
    if input_format == "dataset":
        return list_dataset(path, access)
    return list_images(path, access)


def list_images(root: str, access: S3Access | None = None) -> ScoreInput:
    """Every image file under ``root`` (any depth), sorted by its path relative to ``root``."""
    if is_s3(root):
        access = access or S3Access.from_env()
        nested = list_s3_class_folders(root, access)
        top = [
            obj["Key"]
            for obj in list_objects(access.client(), root, access, delimiter="/")
            if not os.path.basename(obj["Key"]).startswith(".") and not obj["Key"].endswith("/")
        ]
        bucket, _ = split_s3(root)
        base = nested.root
        files = [(os.path.basename(k), f"s3://{bucket}/{k}") for k in top]
    else:
        if not os.path.isdir(root):
            raise ValueError(f"input {root!r} is not an existing folder of images")
        nested = list_class_folders(root)
        base = nested.root
        files = [
            (entry.name, entry.path)
            for entry in os.scandir(root)
            if entry.is_file() and not entry.name.startswith(".")
        ]
    units = [Unit(source, path) for source, path in files]
    units += [Unit(item.source, item.path, problem=item.problem) for item in nested.items]
    units.sort(key=lambda unit: unit.source)
    return ScoreInput(units, base or root)


def list_dataset(root: str, access: S3Access | None = None) -> ScoreInput:
    """Row groups of the Parquet files under ``root``: a split folder, or a dataset version
    folder holding preprocessing's manifest.json (then every split of its attempt)."""
    if is_s3(root):
        access = access or S3Access.from_env()
    stored_shape = None
    manifest = _read_manifest(root, access)
    if manifest is not None:
        if manifest.get("params", {}).get("image_encoding", "png") == "raw":
            raise ValueError(
                f"{root!r} stores raw pixels (data.image_encoding='raw'): scoring decodes "
                "encoded image files; preprocess the images to score with image_encoding='png' "
                "or 'jpeg'"
            )
        root = manifest["path"]
        stored_shape = tuple(manifest["image_shape"])
    files = _parquet_files(root, access)
    if not files:
        raise ValueError(
            f"no Parquet files in {root!r}: input_format 'dataset' expects a folder of Parquet "
            "files with image and source columns (a split folder of a preprocessed dataset, "
            "or the folder holding its manifest.json)"
        )
    units = []
    for path in files:
        metadata = _footer(path, access)
        names = set(metadata.schema.names)
        if not {IMAGE_COLUMN, SOURCE_COLUMN} <= names:
            raise ValueError(
                f"{path} has columns {sorted(names)}: input_format 'dataset' needs "
                f"{IMAGE_COLUMN!r} (encoded image bytes) and {SOURCE_COLUMN!r}"
            )
        for group in range(metadata.num_row_groups):
            rows = metadata.row_group(group).num_rows
            if rows:
                units.append(Unit(path, path, group, rows))
    result = ScoreInput(units, root, stored_shape)
    if stored_shape is None and units:
        result = ScoreInput(units, root, first_image_shape(units[0], access))
    return result


def first_image_shape(unit: Unit, access: S3Access | None) -> tuple[int, ...]:
    """The shape of the first image of a dataset, decoded on the driver."""
    from PIL import Image

    _sources, images = read_row_group(unit.path, unit.row_group, access)
    with Image.open(io.BytesIO(images[0])) as image:
        return tuple(np.asarray(image).shape)


def _read_manifest(root: str, access: S3Access | None) -> dict | None:
    data = Location(root, access).read_bytes(MANIFEST)
    return json.loads(data) if data is not None else None


def _parquet_files(root: str, access: S3Access | None) -> list[str]:
    def wanted(relative: str) -> bool:
        parts = relative.split("/")
        return relative.endswith(".parquet") and not any(p[:1] in ("_", ".") for p in parts)

    if is_s3(root):
        bucket, prefix = split_s3(root)
        prefix = prefix.rstrip("/") + "/" if prefix.strip("/") else ""
        keys = [o["Key"] for o in list_objects(access.client(), root, access)]
        return sorted(f"s3://{bucket}/{k}" for k in keys if wanted(k[len(prefix) :]))
    found = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d[:1] not in ("_", "."))
        for name in filenames:
            relative = os.path.relpath(os.path.join(dirpath, name), root).replace(os.sep, "/")
            if wanted(relative):
                found.append(join(dirpath, name))
    return sorted(found)


def _footer(path: str, access: S3Access | None):
    import pyarrow.parquet as pq

    with open_input(path, access) as f:
        return pq.ParquetFile(f).metadata
