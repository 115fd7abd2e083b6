"""A split read with pyarrow alone: no Petastorm, and nothing unpickled.

Petastorm's ``_common_metadata`` is a pickled Unischema that every Petastorm reader unpickles
(whoever can write the prefix runs code in every rank). Preprocessing also writes a plain JSON
description of each split, ``_hvdflow_schema.json``::

    {"format": "hvdflow-split", "version": 1,
     "fields": [{"name": "image", "dtype": "uint8", "shape": [28, 28], "codec": "png"},
                {"name": "label", "dtype": "int32", "shape": [], "codec": "scalar"}, ...],
     "row_groups": {"part-00000.parquet": 4, "part-00001.parquet": 4}}

``row_groups`` is Petastorm's ``ROW_GROUPS_PER_FILE_KEY``. This module is that contract
(``SplitDescription``) and a reader of it that shards row groups by Petastorm's rule and decodes
the same pixels, so a rank sees the same rows in the same order as with Petastorm's reader.
"""

from __future__ import annotations

import json
import random
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from urllib.parse import urlparse

import numpy as np

from hvdflow.infra.storage.access import S3Access
from hvdflow.serving.images import UnreadableImage, decode

SCHEMA_FILE = "_hvdflow_schema.json"
FORMAT = "hvdflow-split"
FORMAT_VERSION = 1
CODECS = ("png", "jpeg", "raw", "scalar")
# Row groups read ahead of the one being decoded, and the threads that read them (pyarrow
# releases the GIL while it reads).
READ_AHEAD = 2
# Rows a stream shuffles together (``iter_batches``), as tf.data's shuffle buffer did per image.
SHUFFLE_ROWS = 1024
_HOW_TO_FIX = "re-run preprocessing to write it (or read this split with reader='petastorm')"


@dataclass(frozen=True)
class FieldDescription:
    """One column: its name, numpy dtype name, shape of one value and codec (``png``, ``jpeg``:
    a compressed uint8 image; ``raw``: its pixels as they are, C order; ``scalar``: the
    Parquet value as it is)."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    codec: str


@dataclass(frozen=True)
class SplitDescription:
    """What a split holds: its fields, and the row groups of each part file."""

    fields: tuple[FieldDescription, ...]
    row_groups: dict[str, int]

    def to_json(self) -> bytes:
        record = {
            "format": FORMAT,
            "version": FORMAT_VERSION,
            "fields": [
                {"name": f.name, "dtype": f.dtype, "shape": list(f.shape), "codec": f.codec}
                for f in self.fields
            ],
            "row_groups": dict(sorted(self.row_groups.items())),
        }
        return json.dumps(record, indent=2).encode()

    @classmethod
    def from_json(cls, data: bytes, where: str) -> SplitDescription:
        """Parse and check a description; RuntimeError naming ``where`` and the fix if bad."""

        def bad(problem: str) -> RuntimeError:
            return RuntimeError(f"{where}: {problem}: {_HOW_TO_FIX}")

        try:
            record = json.loads(data)
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise bad(f"not valid JSON ({e})") from None
        if not isinstance(record, dict) or record.get("format") != FORMAT:
            raise bad(f'not an hvdflow split description (no "format": "{FORMAT}")')
        version = record.get("version")
        if version != FORMAT_VERSION:
            raise bad(
                f"format version {version!r}, this hvdflow reads version {FORMAT_VERSION} "
                "(a newer hvdflow wrote it: upgrade hvdflow)"
            )
        try:
            fields = tuple(_field(entry) for entry in record["fields"])
            row_groups = {str(name): int(n) for name, n in record["row_groups"].items()}
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            raise bad(f"malformed fields or row_groups ({type(e).__name__}: {e})") from None
        if not fields or any(n < 0 for n in row_groups.values()):
            raise bad("no fields, or a negative row-group count")
        return cls(fields, row_groups)

    def field(self, name: str) -> FieldDescription:
        for f in self.fields:
            if f.name == name:
                return f
        known = ", ".join(f.name for f in self.fields)
        raise ValueError(f"field {name!r} is not in this split (it has {known})")


def _field(entry: dict) -> FieldDescription:
    field = FieldDescription(
        name=str(entry["name"]),
        dtype=np.dtype(entry["dtype"]).name,
        shape=tuple(int(side) for side in entry["shape"]),
        codec=str(entry["codec"]),
    )
    if field.codec not in CODECS:
        raise ValueError(f"field {field.name!r} has codec {field.codec!r}, not one of {CODECS}")
    return field


def pieces(row_groups: dict[str, int]) -> list[tuple[str, int]]:
    """Every row group as (part file, index in it), in Petastorm's order: files sorted by path,
    each file's row groups in order (``petastorm.etl.dataset_metadata.load_row_groups``)."""
    return [(name, i) for name in sorted(row_groups) for i in range(row_groups[name])]


def shard_pieces(
    row_groups: dict[str, int], rank: int, size: int, seed: int | None = None
) -> list[tuple[str, int]]:
    """Rank ``rank`` of ``size``'s row groups, by Petastorm's ``Reader._partition_row_groups``:
    number them in ``pieces`` order, shuffle with ``random.Random(seed)`` if seeded, keep those
    with ``number % size == rank``. The seed changes a shard's order, never what it holds."""
    if not isinstance(size, int) or not isinstance(rank, int) or size < 1:
        raise ValueError(f"rank={rank!r}, size={size!r}: both must be ints, size at least 1")
    if not 0 <= rank < size:
        raise ValueError(f"rank={rank} is not in [0, size={size}): pass 0 <= rank < size")
    everything = pieces(row_groups)
    if len(everything) < size:
        raise ValueError(
            f"the split has {len(everything)} row groups, fewer than size={size}: some ranks "
            "would get no data; use fewer ranks or preprocess with at least that many shards"
        )
    numbers = list(range(len(everything)))
    if seed is not None:
        random.Random(seed).shuffle(numbers)
    return [everything[n] for n in numbers if n % size == rank]


def _join(url: str, name: str) -> str:
    return f"{url.rstrip('/')}/{name}"


class SplitFiles:
    """A split's files on the filesystem its URL names (local path, ``file://`` or ``s3://``)."""

    def __init__(self, url: str):
        self.url = url
        self.fs, self.root = _filesystem_and_path(url)

    def read_bytes(self, name: str) -> bytes | None:
        import pyarrow.fs as pafs

        path = _join(self.root, name)
        try:
            with self.fs.open_input_stream(path) as f:
                return f.read()
        except FileNotFoundError:
            return None
        except OSError:  # pyarrow's S3 reports a missing key as OSError
            if self.fs.get_file_info(path).type == pafs.FileType.NotFound:
                return None
            raise

    def parquet(self, name: str):
        """One part file: a local one memory-mapped (its pages read in place, not copied first),
        each row group's column chunks fetched at once (``pre_buffer``)."""
        import pyarrow as pa
        import pyarrow.fs as pafs
        import pyarrow.parquet as pq

        path = _join(self.root, name)
        if isinstance(self.fs, pafs.LocalFileSystem):
            return pq.ParquetFile(pa.memory_map(path), pre_buffer=True)
        return pq.ParquetFile(self.fs.open_input_file(path), pre_buffer=True)


def _filesystem_and_path(url: str):
    """A pyarrow filesystem and the path in it; ``s3://`` from the standard AWS variables."""
    import pyarrow.fs as pafs

    parsed = urlparse(url)
    if parsed.scheme == "s3":
        access = S3Access.from_env()
        options = {"region": access.region}
        if access.endpoint_url:
            endpoint = urlparse(access.endpoint_url)
            options["endpoint_override"] = endpoint.netloc or endpoint.path
            options["scheme"] = endpoint.scheme or "https"
        if access.access_key_id:
            options.update(
                access_key=access.access_key_id,
                secret_key=access.secret_access_key,
                session_token=access.session_token,
            )
        return pafs.S3FileSystem(**options), f"{parsed.netloc}{parsed.path}".rstrip("/")
    if parsed.scheme == "file":
        return pafs.LocalFileSystem(), parsed.path.rstrip("/") or "/"
    if parsed.scheme:
        raise ValueError(f"{url}: not a local path, file:// or s3:// URL")
    return pafs.LocalFileSystem(), url.rstrip("/") or "/"


def read_description(url: str, files: SplitFiles | None = None) -> SplitDescription:
    """The split's ``_hvdflow_schema.json``; RuntimeError naming the fix if missing or bad."""
    files = files or SplitFiles(url)
    where = _join(url, SCHEMA_FILE)
    data = files.read_bytes(SCHEMA_FILE)
    if data is None:
        raise RuntimeError(
            f"{where} does not exist: the split was written before hvdflow described its splits "
            f"in JSON, or the file was deleted; {_HOW_TO_FIX}"
        )
    return SplitDescription.from_json(data, where)


class ShardReader:
    """One rank's shard of a split, row group by row group, decoded to numpy arrays."""

    def __init__(self, url: str, *, rank: int = 0, size: int = 1, fields=("image", "label")):
        self.files = SplitFiles(url)
        self.description = read_description(url, self.files)
        self.fields = tuple(self.description.field(name) for name in fields)
        self.rank, self.size = rank, size
        self._local = threading.local()  # each reading thread's open files

    def pieces(self, seed: int | None = None) -> list[tuple[str, int]]:
        return shard_pieces(self.description.row_groups, self.rank, self.size, seed)

    def piece_rows(self, piece: tuple[str, int]) -> int:
        """The rows of one row group, from its file's footer (nothing decoded)."""
        name, index = piece
        return self._file(name).metadata.row_group(index).num_rows

    def read_piece(self, piece: tuple[str, int], rows=None) -> tuple[np.ndarray, ...]:
        """One row group's columns, decoded: one array per field, rows first. ``rows``: only
        these rows of it (indices within the row group), the others left undecoded."""
        name, index = piece
        parquet = self._file(name)
        table = parquet.read_row_group(index, columns=[f.name for f in self.fields])
        if rows is not None:
            table = table.take(rows)
        try:
            return tuple(_decoded(f, table.column(f.name)) for f in self.fields)
        except UnreadableImage as e:
            raise RuntimeError(
                f"{_join(self.files.url, name)}, row group {index}: an image is not the image "
                f"{SCHEMA_FILE} describes ({e.reason}): re-run preprocessing"
            ) from None

    def _file(self, name: str):
        opened = self._local.__dict__.setdefault("files", {})
        parquet = opened.get(name)
        if parquet is None:
            parquet = self.files.parquet(name)
            expected = self.description.row_groups[name]
            if parquet.num_row_groups != expected:
                raise RuntimeError(
                    f"{_join(self.files.url, name)} has {parquet.num_row_groups} row groups, "
                    f"{SCHEMA_FILE} says {expected}: the split changed after it was written; "
                    "re-run preprocessing"
                )
            opened[name] = parquet
        return parquet

    def iter_pieces(self, order: list[tuple[str, int]]):
        """``read_piece`` of each piece in ``order``, READ_AHEAD read and decoded ahead."""
        with ThreadPoolExecutor(READ_AHEAD, thread_name_prefix="hvdflow-parquet") as pool:
            pending = []
            for piece in order:
                pending.append(pool.submit(self.read_piece, piece))
                if len(pending) > READ_AHEAD:
                    yield pending.pop(0).result()
            for future in pending:
                yield future.result()


_PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def _png_size(data: bytes) -> tuple[int, int] | None:
    """A PNG's (height, width) from its header (IHDR comes first), or None if not a PNG."""
    if len(data) < 24 or not data.startswith(_PNG_SIGNATURE) or data[12:16] != b"IHDR":
        return None
    return int.from_bytes(data[20:24], "big"), int.from_bytes(data[16:20], "big")


# JPEG's start-of-frame markers (baseline, progressive, ...): not DHT (C4), JPG (C8) or DAC (CC).
_SOF = set(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC}


def _jpeg_size(data: bytes) -> tuple[int, int] | None:
    """A JPEG's (height, width) from its start-of-frame segment, or None if not a JPEG."""
    if not data.startswith(b"\xff\xd8"):
        return None
    at = 2
    while at + 9 <= len(data) and data[at] == 0xFF:
        marker, length = data[at + 1], int.from_bytes(data[at + 2 : at + 4], "big")
        if marker in _SOF:
            return int.from_bytes(data[at + 5 : at + 7], "big"), int.from_bytes(
                data[at + 7 : at + 9], "big"
            )
        at += 2 + length
    return None


def _opencv():
    """OpenCV where installed (it decodes a small PNG about 8x faster than Pillow), else None."""
    try:
        import cv2  # noqa: PLC0415, TID253 (optional, and loaded only by a rank that reads)
    except ImportError:
        return None
    return cv2


def _decode_stored(value: bytes, field: FieldDescription, color_mode: str, cv2) -> np.ndarray:
    """A stored image to its field's pixels: a PNG or JPEG of exactly the field's shape by
    OpenCV, as Petastorm's codec does; anything else through ``serving.images.decode``, which
    checks the size first, so a decompression bomb in a writable prefix is refused undecoded."""
    size = field.shape[:2]
    stored = _png_size(value) if field.codec == "png" else _jpeg_size(value)
    if cv2 is not None and stored == tuple(size):
        pixels = cv2.imdecode(np.frombuffer(value, dtype=np.uint8), cv2.IMREAD_UNCHANGED)
        if pixels is not None and pixels.shape == tuple(field.shape) and pixels.dtype == np.uint8:
            return cv2.cvtColor(pixels, cv2.COLOR_BGR2RGB) if color_mode == "RGB" else pixels
    return decode(value, size, color_mode, size[0] * size[1])


def _raw_pixels(field: FieldDescription, column) -> np.ndarray:
    """A column of raw values as one array, viewed in place in Arrow's data buffer, where a
    binary column's values lie back to back: no row is copied."""
    import pyarrow as pa  # noqa: PLC0415 (loaded by now: the column is pyarrow's)

    array = column
    if isinstance(column, pa.ChunkedArray):  # combine_chunks copies even a single chunk
        array = column.chunk(0) if column.num_chunks == 1 else column.combine_chunks()
    expected = int(np.prod(field.shape)) * np.dtype(field.dtype).itemsize
    offset_type = np.int64 if pa.types.is_large_binary(array.type) else np.int32
    _validity, offsets, data = array.buffers()
    offsets = np.frombuffer(offsets, dtype=offset_type)[
        array.offset : array.offset + len(array) + 1
    ]
    lengths = np.diff(offsets)
    if array.null_count or (lengths != expected).any():
        wrong = "none" if array.null_count else int(lengths[lengths != expected][0])
        raise ValueError(
            f"field {field.name!r} stores raw {field.dtype} pixels of shape {field.shape} "
            f"({expected} bytes), but a value has {wrong} bytes: the split is damaged; "
            "re-run preprocessing"
        )
    if not len(array):
        return np.empty((0, *field.shape), dtype=field.dtype)
    pixels = np.frombuffer(data, dtype=np.uint8)[offsets[0] : offsets[-1]]
    return pixels.view(field.dtype).reshape(len(array), *field.shape)


def _decoded(field: FieldDescription, column) -> np.ndarray:
    if field.codec == "raw":
        return _raw_pixels(field, column)
    if field.codec in ("png", "jpeg"):
        color_mode = "L" if len(field.shape) == 2 else "RGB"
        cv2 = _opencv()
        images = [_decode_stored(value, field, color_mode, cv2) for value in column.to_pylist()]
        if not images:
            return np.empty((0, *field.shape), dtype=field.dtype)
        return np.stack(images).astype(field.dtype, copy=False)
    return np.asarray(column.to_numpy(zero_copy_only=False)).astype(field.dtype, copy=False)


def load_shard(url: str, *, rank: int = 0, size: int = 1, fields=("image", "label")):
    """This rank's whole shard as numpy arrays, one per field, in the order Petastorm's
    ``load_shard`` gives (``hvdflow.training.reader``)."""
    reader = ShardReader(url, rank=rank, size=size, fields=fields)
    parts = list(reader.iter_pieces(reader.pieces()))
    if not parts:
        return tuple(np.empty((0, *f.shape), dtype=f.dtype) for f in reader.fields)
    return tuple(np.concatenate(columns) for columns in zip(*parts, strict=True))


def load_rows(url: str, rows, fields=("image", "label")):
    """Rows ``rows`` (sorted indices into the stored order) as numpy arrays, one per field: only
    the row groups holding them are read, and only those rows decoded."""
    reader = ShardReader(url, fields=fields)
    wanted = np.asarray(rows, dtype=np.int64)
    parts, start = [], 0
    for piece in reader.pieces():
        count = reader.piece_rows(piece)
        lo, hi = np.searchsorted(wanted, [start, start + count])
        if hi > lo:
            parts.append(reader.read_piece(piece, wanted[lo:hi] - start))
        start += count
    if not parts:
        return tuple(np.empty((0, *f.shape), dtype=f.dtype) for f in reader.fields)
    return tuple(np.concatenate(columns) for columns in zip(*parts, strict=True))


def iter_row_groups(
    url: str,
    *,
    rank: int = 0,
    size: int = 1,
    fields=("image", "label"),
    num_epochs: int | None = None,
    shuffle: bool = True,
    seed: int = 0,
):
    """This rank's row groups (a tuple of arrays each), epoch after epoch (``num_epochs=None``:
    forever). The shard is Petastorm's for ``seed``; ``shuffle`` draws a new order of its row
    groups each epoch from ``seed``."""
    reader = ShardReader(url, rank=rank, size=size, fields=fields)
    order = reader.pieces(seed)
    rng = np.random.default_rng(seed)
    epoch = 0
    while num_epochs is None or epoch < num_epochs:
        epoch_order = [order[i] for i in rng.permutation(len(order))] if shuffle else order
        yield from reader.iter_pieces(epoch_order)
        epoch += 1


def _gathered(pieces: list[tuple[np.ndarray, ...]], starts: np.ndarray, rows: np.ndarray):
    """Rows ``rows`` (of the pieces laid end to end) of each column, grouped by piece, each row
    copied once, straight into its place in the batch."""
    owner = np.searchsorted(starts, rows, side="right") - 1
    by_piece = np.argsort(owner, kind="stable")
    rows, owner = rows[by_piece], owner[by_piece]
    bounds = np.searchsorted(owner, np.arange(len(pieces) + 1))
    batch = []
    for column in range(len(pieces[0])):
        first = pieces[0][column]
        out = np.empty((len(rows), *first.shape[1:]), dtype=first.dtype)
        for piece, (lo, hi) in enumerate(zip(bounds[:-1], bounds[1:], strict=True)):
            if hi > lo:
                local = rows[lo:hi] - starts[piece]
                np.take(pieces[piece][column], local, axis=0, out=out[lo:hi])
        batch.append(out)
    return tuple(batch)


def iter_batches(url: str, *, batch_size: int, seed: int = 0, shuffle: bool = True, **rows):
    """``iter_row_groups(url, seed=seed, shuffle=shuffle, **rows)`` in batches of ``batch_size``
    rows (the last may be short). Shuffled, each batch is drawn from a pool of SHUFFLE_ROWS rows
    or more that every row group tops up, as tf.data's shuffle buffer draws images: batches come
    as steadily as row groups do, where cutting whole windows made a rank wait for each one."""
    rng = np.random.default_rng(seed)
    held: list[tuple[np.ndarray, ...]] = []  # row groups with rows not yet given
    starts: list[int] = []  # each held row group's first row, counted over the stream
    left: list[int] = []  # and how many of its rows are still to give
    pool = np.empty(0, dtype=np.int64)  # the rows not yet given
    floor = max(SHUFFLE_ROWS, batch_size) if shuffle else batch_size
    seen = 0

    def draw(count: int):
        nonlocal pool, held, starts, left
        picked = rng.choice(len(pool), count, replace=False) if shuffle else np.arange(count)
        rows, pool = pool[picked], np.delete(pool, picked)
        batch = _gathered(held, np.asarray(starts), rows)
        given = np.bincount(np.searchsorted(starts, rows, side="right") - 1, minlength=len(held))
        keep = [i for i in range(len(held)) if left[i] > given[i]]  # a row group fully given goes
        held, starts = [held[i] for i in keep], [starts[i] for i in keep]
        left = [left[i] - int(given[i]) for i in keep]
        return batch

    for columns in iter_row_groups(url, seed=seed, shuffle=shuffle, **rows):
        held.append(columns)
        starts.append(seen)
        left.append(len(columns[0]))
        pool = np.concatenate([pool, np.arange(seen, seen + len(columns[0]))])
        seen += len(columns[0])
        while len(pool) >= floor:
            yield draw(batch_size)
    while len(pool):
        yield draw(min(batch_size, len(pool)))
