"""What preprocessing makes of a listing (``hvdflow.tasks.images.listing``): the labels of its
records, the bundled digits as a tree to list, and the dataset fingerprint: a hash of the
listing (no image is read), the parameters and the code, so an unchanged input reuses the
published dataset before Spark decodes anything.
"""

from __future__ import annotations

import functools
import gzip
import hashlib
import json
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

from hvdflow.infra.storage.access import S3Access
from hvdflow.infra.storage.uris import is_s3, split_s3
from hvdflow.tasks import images
from hvdflow.tasks.images.listing import Listing, open_idx


def listed_records(listing: Listing, label_index: dict[str, int], access: S3Access | None):
    """A function giving (item position, label index, source) for every listed record: one
    per file, or per image of an IDX range (its labels file read once here). Records whose
    label is not a class, and unusable items, are left out: the executors quarantine them."""
    labels_of: dict[str, bytes] = {}
    for item in listing.items:
        if item.index is not None and item.labels_path not in labels_of:
            labels_of[item.labels_path] = _read_whole(item.labels_path, access)

    def records():
        for i, item in enumerate(listing.items):
            if item.problem is not None:  # quarantined without being read
                continue
            if item.index is None:
                yield i, label_index[item.label], item.source
                continue
            name = item.source.rsplit("#", 1)[0]
            labels = labels_of[item.labels_path][8 + item.index : 8 + item.index + item.count]
            for offset, value in enumerate(labels):
                label = label_index.get(str(value))
                if label is not None:
                    yield i, label, f"{name}#{item.index + offset}"

    return records


def _read_whole(path: str, access: S3Access | None) -> bytes:
    """A (small) file's content, gunzipped when it is gzip."""
    if not is_s3(path):
        with open_idx(path) as f:
            return f.read()
    bucket, key = split_s3(path)
    data = (access or S3Access.from_env()).client().get_object(Bucket=bucket, Key=key)["Body"]
    data = data.read()
    return gzip.decompress(data) if data[:2] == b"\x1f\x8b" else data


class MissingDigits(RuntimeError):
    """The bundled digits cannot be written here: scikit-learn (or Pillow) is not installed."""


def write_digits_tree(root: str) -> str:
    """scikit-learn's bundled 1,797 real 8x8 digits as a class-folder tree of PNGs (once)."""
    base = Path(root)
    done = base / ".complete"
    if done.exists():
        return str(base)
    try:
        from PIL import Image

        from hvdflow.training.digits import bundled_digits  # noqa: PLC0415 (lazy: numpy)

        images, labels = bundled_digits()
    except ImportError as e:
        raise MissingDigits(
            f"the bundled digits ({root}) are written from scikit-learn's copy, and this "
            f"environment lacks it ({e.name}: the thin Spark Connect worker has neither it nor "
            "Pillow): give the input of your own (--input DIR or s3://..., a folder of class "
            "sub-folders the cluster can read), or pip install scikit-learn pillow"
        ) from None

    for i, (image, label) in enumerate(zip(images, labels, strict=True)):
        folder = base / str(label)
        folder.mkdir(parents=True, exist_ok=True)
        pixels = (image * (255.0 / 16.0)).round().astype("uint8")
        Image.fromarray(pixels, mode="L").save(folder / f"digit_{i:04d}.png")
    done.write_text("sklearn.datasets.load_digits\n")
    return str(base)


def fingerprint(listing: Listing, params: dict, code: str | None = None) -> str:
    """sha256 of the preprocessing code's version (``code``, default ``code_version()``), the
    input listing (paths, sizes, mtimes or ETags) and the parameters."""
    digest = hashlib.sha256()
    digest.update(f"{code_version() if code is None else code}\n".encode())
    digest.update(json.dumps(params, sort_keys=True).encode())
    for path, size, mtime_ns in sorted(listing.files):
        digest.update(f"{path}\0{size}\0{mtime_ns}\n".encode())
    return digest.hexdigest()


@functools.cache
def code_version() -> str:
    """hvdflow's version and the sha256 of this package's and ``hvdflow.tasks.images``' source:
    an upgrade that changes how images become rows reuses no dataset of the old code."""
    try:
        release = version("hvdflow")
    except PackageNotFoundError:  # run from a checkout that was never installed
        release = "unknown"
    digest = hashlib.sha256()
    for package in (Path(__file__).parent, Path(images.__file__).parent):
        for module in sorted(package.glob("*.py")):
            digest.update(f"{package.name}/{module.name}\0".encode())
            digest.update(module.read_bytes())
            digest.update(b"\0")
    return f"{release}+{digest.hexdigest()}"
