"""What to read, listed on the driver: a class-folder tree (local or ``s3://``), or MNIST IDX
files, as the items the executors fetch and decode.

Listing reads only names, sizes and versions (mtimes, ETags), so that preprocessing's fingerprint
can reuse a dataset before Spark decodes anything; ``s3://`` is listed with paginated
ListObjectsV2 calls, no request per object.
"""

from __future__ import annotations

import gzip
import logging
import os
import struct
import zlib
from dataclasses import dataclass
from pathlib import Path

from hvdflow.infra.storage.access import S3Access
from hvdflow.infra.storage.files import list_objects
from hvdflow.infra.storage.uris import is_s3, split_s3
from hvdflow.tasks.images.walk import walk_class_folder

logger = logging.getLogger(__name__)

# Classic MNIST file names; the `-idx3-ubyte` part is what identifies the format.
MNIST_FILES = {
    "train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
    "t10k": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"),
}
# IDX images per Spark item: one task decodes a range of records, not the whole file.
IDX_CHUNK = 2000


@dataclass(frozen=True)
class Item:
    """One thing to decode: an image file (``index`` and ``row_group`` None), a range of records
    of an IDX file, or a row group of a Parquet file of encoded images (scoring's datasets)."""

    source: str  # what the quarantine report and the dataset's `source` column show
    label: str
    path: str  # a local path or an s3:// URI
    index: int | None = None  # first IDX record
    count: int = 1  # IDX records in this item
    labels_path: str | None = None
    # Why the listing knows it is unusable (a broken link, a named pipe): quarantined, never read.
    problem: str | None = None
    row_group: int | None = None  # of the Parquet file at ``path``: its (source, image) rows


@dataclass(frozen=True)
class Listing:
    items: list[Item]
    # (path, size, version) of every input file: mtime_ns locally, the ETag of an object
    files: list[tuple[str, int, int | str]]
    labels: list[str]  # class names; their order is the label index
    root: str = ""  # the input folder or s3:// prefix, as the executors must see it


def list_class_folders(root: str) -> Listing:
    """A Caltech101-style tree: ``root/<class>/<image>``; top-level files are ignored. Entries
    that cannot be images (walk.py) are items with a ``problem``. A class folder with no file to
    decode is left out, with a warning (a dead output of the model); the rest are numbered in
    name order."""
    base = Path(root)
    if not base.is_dir():
        raise ValueError(f"input {root!r} is not a directory of class sub-folders")
    items, files, classes = [], [], []
    names = sorted(p.name for p in base.iterdir() if p.is_dir() and not p.name.startswith("."))
    for name in names:
        found = walk_class_folder(str(base / name), str(base))
        for entry in found:
            version = entry.mtime_ns if entry.problem is None else entry.problem
            files.append((entry.path, entry.size, version))
            source = os.path.relpath(entry.path, base)
            items.append(Item(source, name, entry.path, problem=entry.problem))
        if any(entry.problem is None for entry in found):
            classes.append(name)
        else:
            unusable = f" (only {len(found)} unusable, see quarantine.csv)" if found else ""
            logger.warning(
                "class folder %r has no files to decode%s: it is left out of the classes",
                str(base / name),
                unusable,
            )
    return Listing(items, files, classes, str(base))


def list_s3_class_folders(uri: str, access: S3Access) -> Listing:
    """The same tree under an ``s3://bucket/prefix/``; objects directly under the prefix,
    folder markers and names starting with a dot (at any level) are ignored."""
    bucket, prefix = split_s3(uri)
    prefix = prefix.rstrip("/") + "/" if prefix.strip("/") else ""
    entries = []
    for obj in list_objects(access.client(), uri, access):
        relative = obj["Key"][len(prefix) :]
        parts = relative.split("/")
        if len(parts) < 2 or not parts[-1] or any(p.startswith(".") or not p for p in parts):
            continue
        entries.append((parts[0], relative, obj))
    entries.sort(key=lambda e: (e[0], e[1]))
    items, files = [], []
    for label, relative, obj in entries:
        path = f"s3://{bucket}/{obj['Key']}"
        files.append((path, int(obj["Size"]), str(obj.get("ETag", "")).strip('"')))
        items.append(Item(relative, label, path))
    classes = sorted({label for label, _, _ in entries})
    return Listing(items, files, classes, f"s3://{bucket}/{prefix}")


def open_idx(path: str):
    """A local IDX file opened for reading its records, gunzipped when it is gzip."""
    with open(path, "rb") as f:
        gzipped = f.read(2) == b"\x1f\x8b"
    return gzip.open(path, "rb") if gzipped else open(path, "rb")


def read_idx_header(path: str) -> tuple[int, tuple[int, ...]]:
    """(type code, dimensions) of an IDX file; ValueError when it is not one."""
    with open_idx(path) as f:
        return parse_idx_header(f.read(64), path)


def parse_idx_header(head: bytes, name: str) -> tuple[int, tuple[int, ...]]:
    """(type code, dimensions) from the first bytes of an (uncompressed) IDX file."""
    magic = head[:4]
    if len(magic) != 4 or magic[:2] != b"\0\0":
        raise ValueError(f"{name} is not an IDX file (bad magic number {magic!r})")
    ndim = magic[3]
    if len(head) < 4 + 4 * ndim:
        raise ValueError(f"{name} is not an IDX file (its header is cut short)")
    return magic[2], struct.unpack(f">{ndim}I", head[4 : 4 + 4 * ndim])


def idx_header_size(ndim: int) -> int:
    return 4 + 4 * ndim


def gunzip_head(data: bytes) -> bytes:
    """The first bytes of a gzip stream, from its first bytes."""
    return zlib.decompressobj(wbits=31).decompress(data)


def _idx_names(stem: str) -> tuple[str, ...]:
    dotted = stem.replace("-idx", ".idx")
    return (stem, stem + ".gz", dotted, dotted + ".gz")


def _find(names: set[str], stem: str) -> str | None:
    return next((n for n in _idx_names(stem) if n in names), None)


def list_mnist_idx(root: str, access: S3Access | None = None) -> Listing:
    """MNIST IDX files (train and/or t10k, gzipped or not) in a folder or an ``s3://`` prefix."""
    if is_s3(root):
        return _list_s3_mnist_idx(root, access or S3Access.from_env())
    base = Path(root)
    names = {p.name for p in base.iterdir()} if base.is_dir() else set()

    def describe(name: str):
        path = str(base / name)
        stat = os.stat(path)
        return path, stat.st_size, stat.st_mtime_ns, read_idx_header(path)[1]

    return _idx_listing(root, str(base), names, describe)


def _list_s3_mnist_idx(root: str, access: S3Access) -> Listing:
    bucket, prefix = split_s3(root)
    prefix = prefix.rstrip("/") + "/" if prefix.strip("/") else ""
    client = access.client()
    objects = {
        o["Key"][len(prefix) :]: o for o in list_objects(client, root, access, delimiter="/")
    }

    def describe(name: str):
        obj = objects[name]
        # One ranged request per IDX file for its header (2 to 4 files), not per image.
        head = client.get_object(Bucket=bucket, Key=obj["Key"], Range="bytes=0-4095")["Body"]
        head = head.read()
        if name.endswith(".gz"):
            head = gunzip_head(head)
        path = f"s3://{bucket}/{obj['Key']}"
        etag = str(obj.get("ETag", "")).strip('"')
        return path, int(obj["Size"]), etag, parse_idx_header(head, path)[1]

    return _idx_listing(root, f"s3://{bucket}/{prefix}", set(objects), describe)


def _idx_listing(root: str, where: str, names: set[str], describe) -> Listing:
    items, files = [], []
    for part, (images_stem, labels_stem) in MNIST_FILES.items():
        images, labels = _find(names, images_stem), _find(names, labels_stem)
        if images is None and labels is None:
            continue
        if images is None or labels is None:
            missing = images_stem if images is None else labels_stem
            raise ValueError(f"{root}: found the {part} files but not {missing}(.gz)")
        images_path, images_size, images_version, image_dims = describe(images)
        labels_path, labels_size, labels_version, label_dims = describe(labels)
        if len(image_dims) != 3 or image_dims[0] != label_dims[0]:
            raise ValueError(
                f"{images_path} holds {image_dims} images but {labels_path} holds "
                f"{label_dims[0]} labels"
            )
        files.append((images_path, images_size, images_version))
        files.append((labels_path, labels_size, labels_version))
        for start in range(0, image_dims[0], IDX_CHUNK):
            count = min(IDX_CHUNK, image_dims[0] - start)
            items.append(Item(f"{images}#{start}", "", images_path, start, count, labels_path))
    if not items:
        raise ValueError(
            f"no MNIST IDX files in {root!r}: expected train-images-idx3-ubyte(.gz) and "
            "train-labels-idx1-ubyte(.gz), or the t10k pair"
        )
    return Listing(items, files, [str(d) for d in range(10)], where)
