"""What to preprocess: input listings for each format, and the dataset fingerprint.

Listing happens on the driver and reads only names, sizes and modification times, so the
fingerprint can say "nothing changed, reuse the dataset" before Spark decodes anything.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import struct
from dataclasses import dataclass
from pathlib import Path

# Classic MNIST file names; the `-idx3-ubyte` part is what identifies the format.
MNIST_FILES = {
    "train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
    "t10k": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"),
}
# IDX images per Spark item: one task decodes a range of records, not the whole file.
IDX_CHUNK = 2000


@dataclass(frozen=True)
class Item:
    """One thing to decode: a file (``index`` None) or a range of records of an IDX file."""

    source: str  # what the quarantine report and the dataset's `source` column show
    label: str
    path: str
    index: int | None = None  # first IDX record
    count: int = 1  # IDX records in this item
    labels_path: str | None = None


@dataclass(frozen=True)
class Listing:
    items: list[Item]
    files: list[tuple[str, int, int]]  # (path, size, mtime_ns) of every input file
    labels: list[str]  # class names; their order is the label index


def list_class_folders(root: str) -> Listing:
    """A Caltech101-style tree: ``root/<class>/<image>``; files at the top level are ignored."""
    base = Path(root)
    if not base.is_dir():
        raise ValueError(f"input {root!r} is not a directory of class sub-folders")
    items, files = [], []
    classes = sorted(p.name for p in base.iterdir() if p.is_dir() and not p.name.startswith("."))
    for name in classes:
        for dirpath, dirnames, filenames in os.walk(base / name):
            dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
            for filename in sorted(filenames):
                if filename.startswith("."):
                    continue
                path = os.path.join(dirpath, filename)
                stat = os.stat(path)
                files.append((path, stat.st_size, stat.st_mtime_ns))
                items.append(Item(os.path.relpath(path, base), name, path))
    return Listing(items, files, classes)


def _open_idx(path: str):
    with open(path, "rb") as f:
        gzipped = f.read(2) == b"\x1f\x8b"
    return gzip.open(path, "rb") if gzipped else open(path, "rb")


def read_idx_header(path: str) -> tuple[int, tuple[int, ...]]:
    """(type code, dimensions) of an IDX file; ValueError when it is not one."""
    with _open_idx(path) as f:
        magic = f.read(4)
        if len(magic) != 4 or magic[:2] != b"\0\0":
            raise ValueError(f"{path} is not an IDX file (bad magic number {magic!r})")
        ndim = magic[3]
        dims = struct.unpack(f">{ndim}I", f.read(4 * ndim))
    return magic[2], dims


def _find(root: Path, stem: str) -> str | None:
    for candidate in (
        stem,
        stem + ".gz",
        stem.replace("-idx", ".idx"),
        stem.replace("-idx", ".idx") + ".gz",
    ):
        if (root / candidate).exists():
            return str(root / candidate)
    return None


def list_mnist_idx(root: str) -> Listing:
    """MNIST IDX files (train and/or t10k, gzipped or not) in ``root``."""
    base = Path(root)
    items, files = [], []
    for part, (images_stem, labels_stem) in MNIST_FILES.items():
        images, labels = _find(base, images_stem), _find(base, labels_stem)
        if images is None and labels is None:
            continue
        if images is None or labels is None:
            missing = images_stem if images is None else labels_stem
            raise ValueError(f"{root}: found the {part} files but not {missing}(.gz)")
        _, image_dims = read_idx_header(images)
        _, label_dims = read_idx_header(labels)
        if len(image_dims) != 3 or image_dims[0] != label_dims[0]:
            raise ValueError(
                f"{images} holds {image_dims} images but {labels} holds {label_dims[0]} labels"
            )
        for path in (images, labels):
            stat = os.stat(path)
            files.append((path, stat.st_size, stat.st_mtime_ns))
        for start in range(0, image_dims[0], IDX_CHUNK):
            count = min(IDX_CHUNK, image_dims[0] - start)
            items.append(
                Item(f"{os.path.basename(images)}#{start}", "", images, start, count, labels)
            )
    if not items:
        raise ValueError(
            f"no MNIST IDX files in {root!r}: expected train-images-idx3-ubyte(.gz) and "
            "train-labels-idx1-ubyte(.gz), or the t10k pair"
        )
    return Listing(items, files, [str(d) for d in range(10)])


def write_digits_tree(root: str) -> str:
    """scikit-learn's bundled 1,797 real 8x8 digits as a class-folder tree of PNGs (once)."""
    from PIL import Image
    from sklearn.datasets import load_digits

    base = Path(root)
    done = base / ".complete"
    if done.exists():
        return str(base)
    digits = load_digits()
    for i, (image, label) in enumerate(zip(digits.images, digits.target, strict=True)):
        folder = base / str(label)
        folder.mkdir(parents=True, exist_ok=True)
        pixels = (image * (255.0 / 16.0)).round().astype("uint8")
        Image.fromarray(pixels, mode="L").save(folder / f"digit_{i:04d}.png")
    done.write_text("sklearn.datasets.load_digits\n")
    return str(base)


def fingerprint(listing: Listing, params: dict) -> str:
    """sha256 of the input listing (paths, sizes, mtimes) and the preprocessing parameters."""
    digest = hashlib.sha256()
    digest.update(json.dumps(params, sort_keys=True).encode())
    for path, size, mtime_ns in sorted(listing.files):
        digest.update(f"{path}\0{size}\0{mtime_ns}\n".encode())
    return digest.hexdigest()
