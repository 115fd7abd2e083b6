"""Publishing a dataset version: the splits' descriptions (and Petastorm's metadata, where it is
installed) and reports, then the manifest; and reading it back.

Publication is atomic: readers open the URLs in ``manifest.json`` and nothing else, and it is
written (one rename, or one object PUT) only after every file of its attempt is complete. A
published dataset whose files went missing or changed reads as none, and is built again.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import asdict

from hvdflow.infra import extras
from hvdflow.infra.storage.attempts import MANIFEST, removable_attempts
from hvdflow.infra.storage.files import Location
from hvdflow.infra.storage.uris import dataset_url, join
from hvdflow.tasks.images.quarantine import write_quarantine
from hvdflow.tasks.preprocess.config import DatasetManifest
from hvdflow.tasks.preprocess.schema import image_fields, image_schema, image_shape
from hvdflow.tasks.preprocess.write import (
    SPLITS,
    arrow_schema,
    write_empty_split,
    write_petastorm_metadata,
    write_split_description,
)
from hvdflow.training.parquet_reader import SCHEMA_FILE, SplitDescription

logger = logging.getLogger(__name__)

# The reports of a published attempt, beside its train/ and val/ splits.
ATTEMPT_FILES = ("labels.json", "quarantine.csv")
# The manifest's record of the attempt's files: relative name -> ETag, or size:mtime locally.
FILES_KEY = "files"


def finish(config, fingerprint, version, attempt, label_index, report):
    """On the driver, once the part files exist: split descriptions, reports, the manifest."""
    attempt_url = version.join(attempt)
    files, done = report.files, report.rows
    fields = image_fields(config.image_size, config.color_mode, config.image_encoding)
    # Petastorm's reader decodes compressed images only: a raw dataset gets no Petastorm metadata.
    with_petastorm = extras.installed(extras.PETASTORM) and config.image_encoding != "raw"
    row_groups = {}
    for split in SPLITS:
        split_url = join(attempt_url, split)
        if not files[split]:  # val_fraction=0: an empty split that still opens
            files[split][write_empty_split(split_url, arrow_schema(), version.access)] = 0
        row_groups[split] = sum(files[split].values())
        if with_petastorm:
            unischema = image_schema(config.image_size, config.color_mode, config.image_encoding)
            row_groups[split] = write_petastorm_metadata(split_url, unischema, files[split])
        write_split_description(split_url, fields, files[split], version.access)
    attempt_dir = Location(attempt_url, version.access)
    write_quarantine(attempt_dir, report.quarantine_parts)
    attempt_dir.write_bytes("labels.json", json.dumps(label_index, indent=2).encode())

    manifest = DatasetManifest(
        path=attempt_url,
        fingerprint=fingerprint,
        train_url=dataset_url(join(attempt_url, "train")),
        val_url=dataset_url(join(attempt_url, "val")),
        train_rows=done["train"],
        val_rows=done["val"],
        quarantined=report.bad,
        label_map=label_index,
        image_shape=image_shape(config.image_size, config.color_mode),
        quarantine_path=join(attempt_url, "quarantine.csv"),
        attempt=attempt,
        train_row_groups=row_groups["train"],
        val_row_groups=row_groups["val"],
    )
    return publish(version, attempt, manifest, config)


def read_manifest(version: Location) -> DatasetManifest | None:
    """The dataset published in ``version``; None when there is none or its files are gone."""
    data = version.read_bytes(MANIFEST)
    if data is None:
        return None
    record = json.loads(data)
    recorded = record.get(FILES_KEY, {})
    fields = DatasetManifest.__dataclass_fields__
    record = {k: v for k, v in record.items() if k in fields}
    record["image_shape"] = tuple(record["image_shape"])
    record["reused"] = True
    manifest = DatasetManifest(**record)
    attempt = Location(manifest.path, version.access)
    present = attempt.signatures()
    missing = missing_files(attempt, present)
    if missing:
        logger.warning(
            "dataset %s lacks %d of its files (e.g. %s): it will be built again",
            manifest.path,
            len(missing),
            missing[0],
        )
        return None
    changed = sorted(name for name, was in recorded.items() if present.get(name, was) != was)
    if changed:
        # Rewritten after publication: its rows could be other rows, or fail to decode.
        logger.warning(
            "dataset %s: %d of its files changed since it was published (e.g. %s): it will be "
            "built again",
            manifest.path,
            len(changed),
            changed[0],
        )
        return None
    return manifest


def missing_files(attempt: Location, present: dict | set | None = None) -> list[str]:
    """The reports, split descriptions, part files and (where Petastorm is installed here, so may
    read it) ``_common_metadata`` that a published attempt lacks; ``present``: the names listed."""
    present = attempt.files() if present is None else present
    missing = [name for name in ATTEMPT_FILES if name not in present]
    with_petastorm = extras.installed(extras.PETASTORM)
    for split in SPLITS:
        description = f"{split}/{SCHEMA_FILE}"
        if description not in present:
            missing.append(description)
            continue
        data = attempt.read_bytes(description) or b""
        described = SplitDescription.from_json(data, attempt.join(description))
        compressed = all(f.codec != "raw" for f in described.fields)
        if with_petastorm and compressed and f"{split}/_common_metadata" not in present:
            missing.append(f"{split}/_common_metadata")
        parts = described.row_groups
        missing += [f"{split}/{part}" for part in sorted(parts) if f"{split}/{part}" not in present]
    return missing


def publish(version: Location, attempt: str, manifest: DatasetManifest, config) -> DatasetManifest:
    """Write the manifest (the moment the attempt becomes the dataset), then tidy up."""
    other = read_manifest(version)
    if other is not None:  # a concurrent run published first: keep its dataset
        logger.info(
            "dataset %s was published meanwhile (%s): keeping it", version.base, other.attempt
        )
        version.remove_tree(attempt)
        return other
    record = {
        **asdict(manifest),
        "params": config.params(),
        "input": config.input,
        "created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    record.pop("reused")
    # Each file's signature at publication, to tell one rewritten since.
    record[FILES_KEY] = Location(manifest.path, version.access).signatures()
    version.write_bytes(MANIFEST, json.dumps(record, indent=2).encode())
    # Not a younger attempt: it may be a run that started with this one and is still writing.
    for name in removable_attempts(version.subfolders(), attempt, None, time.time()):
        try:
            version.remove_tree(name)
            logger.info("removed %s, left by an unfinished run", version.join(name))
        except Exception as e:  # never read (no manifest names it): only clutter
            logger.warning("could not remove %s: %s", version.join(name), e)
    return manifest
