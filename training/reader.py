"""Petastorm dataset to ``tf.data``, sharded by rank: how training ranks read preprocessed data.

Rank ``r`` of ``n`` reads every n-th row group, so each row is read once per epoch. Shards can
differ by a row group, so training fixes ``steps_per_epoch()`` rather than run each shard to its
end: Horovod ranks that take different numbers of steps wait on each other forever.

A shard that fits in memory (``in_memory=True``) is decoded once into one uint8 array: later
epochs cost no reader threads and no PNG decoding competing with training for the rank's core.
"""

from __future__ import annotations

import posixpath
import warnings
from collections import namedtuple
from contextlib import contextmanager
from typing import Literal

import numpy as np

from hvdflow.infra import extras
from hvdflow.infra.storage.access import s3_endpoint
from hvdflow.training import parquet_reader
from hvdflow.training.autograph import run_petastorm_unconverted
from hvdflow.training.synthetic import is_synthetic, synthetic_shard

# Petastorm 0.13 calls pyarrow 14's deprecated ParquetDataset API: a dozen FutureWarnings per
# rank and attempt that no user can act on.
warnings.filterwarnings("ignore", category=FutureWarning, module=r"petastorm(\.|$)")

Reader = Literal["petastorm", "pyarrow"]
READERS = ("petastorm", "pyarrow")


def default_reader() -> Reader:
    """Petastorm's reader where it is installed (the classic profile), else pyarrow's."""
    return "petastorm" if extras.installed(extras.PETASTORM) else "pyarrow"


def _checked_reader(reader: str | None) -> Reader:
    """``reader``, or the default for None; a reader that is not installed fails here."""
    reader = reader or default_reader()
    if reader not in READERS:
        raise ValueError(f"reader={reader!r}: expected one of {', '.join(READERS)}")
    if reader == "petastorm":
        extras.require(extras.PETASTORM, "reader='petastorm'", "reader='pyarrow'")
    return reader


def filesystem_for(url: str):
    """A pyarrow filesystem for ``s3://`` URLs on the configured endpoint (None for local)."""
    if not url.startswith("s3://"):
        return None

    import s3fs
    from pyarrow.filesystem import S3FSWrapper

    class _S3FSWrapper(S3FSWrapper):
        # pyarrow 14's walk() calls s3fs' private _ls, a coroutine in today's s3fs; the
        # public ls() gives the same listing synchronously.
        def walk(self, path, refresh=False):
            path = path.replace("s3://", "", 1).rstrip("/")
            directories, files = [], []
            for entry in self.fs.ls(path, detail=True, refresh=refresh):
                name = posixpath.basename(entry["name"].rstrip("/"))
                (directories if entry["type"] == "directory" else files).append(name)
            yield path, sorted(directories), sorted(files)
            for directory in sorted(directories):
                yield from self.walk(posixpath.join(path, directory), refresh=refresh)

    endpoint = s3_endpoint()
    client_kwargs = {"endpoint_url": endpoint} if endpoint else {}
    # petastorm 0.13 with pyarrow 14 fails on storage_options; a wrapped s3fs works.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # deprecated, and the only way here
        return _S3FSWrapper(s3fs.S3FileSystem(client_kwargs=client_kwargs))


def shard_megabytes(rows: int, size: int, image_shape) -> float:
    """The decoded size of one rank's shard, as uint8 images (what ``in_memory`` holds)."""
    pixels = 1
    for side in image_shape:
        pixels *= int(side)
    return rows / max(1, size) * pixels / 2**20


def load_shard(
    url: str,
    *,
    rank: int = 0,
    size: int = 1,
    fields=("image", "label"),
    reader: Reader | None = None,
):
    """This rank's whole shard as numpy arrays, one per field, in the stored order, the same with
    either ``reader``; a ``synthetic:`` URL is answered from memory."""
    if is_synthetic(url):
        return synthetic_shard(url, rank=rank, size=size, fields=tuple(fields))
    reader = _checked_reader(reader)
    if reader == "pyarrow":
        return parquet_reader.load_shard(url, rank=rank, size=size, fields=tuple(fields))
    from petastorm import make_reader

    with make_reader(
        url,
        schema_fields=list(fields),
        cur_shard=rank,
        shard_count=size,
        num_epochs=1,
        shuffle_row_groups=False,
        workers_count=2,
        filesystem=filesystem_for(url),
    ) as reader:
        rows = list(reader)
    return tuple(np.stack([getattr(row, f) for row in rows]) for f in fields)


def steps_per_epoch(rows: int, size: int, batch_size: int) -> int:
    """Steps every rank can take each epoch with data to spare: the same number on all ranks."""
    return max(1, rows // (size * batch_size))


def normalized_batch(images, labels):
    import tensorflow as tf

    images = tf.cast(images, tf.float32) / 255.0
    if len(images.shape) == 3:  # (batch, height, width): grayscale gets its channel axis
        images = images[..., tf.newaxis]
    return images, tf.cast(labels, tf.int32)


def _normalized_rows(rows):
    return normalized_batch(rows.image, rows.label)


def _normalized_example(row):
    import tensorflow as tf

    image = tf.cast(row.image, tf.float32) / 255.0
    if len(row.image.shape) == 2:  # (height, width): grayscale gets its channel axis
        image = image[..., tf.newaxis]
    return image, tf.cast(row.label, tf.int32)


def _pyarrow_batches(url: str, fields, **batching):
    """A ``tf.data.Dataset`` of this shard's rows in batches of namedtuples (as Petastorm gives
    rows), shuffled and batched in numpy (``parquet_reader.iter_batches(url, **batching)``) on a
    Python thread."""
    import tensorflow as tf

    description = parquet_reader.read_description(url)
    row = namedtuple("Row", fields)
    specs = []
    for name in fields:
        field = description.field(name)
        dtype = tf.string if field.dtype == "str" else tf.as_dtype(field.dtype)
        specs.append(tf.TensorSpec((None, *field.shape), dtype))

    def batches():
        for columns in parquet_reader.iter_batches(url, fields=tuple(fields), **batching):
            yield row(*columns)

    return tf.data.Dataset.from_generator(batches, output_signature=row(*specs))


def without_autotuning(dataset):
    """``dataset`` without tf.data's autotuning thread.

    That thread sleeps for a period that doubles over the run (up to a minute), and deleting the
    iterator waits for it to wake: ``model.fit`` returned tens of seconds after its last epoch.
    Steady epochs are no slower without it; AUTOTUNE then means TensorFlow's fixed defaults.
    """
    import tensorflow as tf

    options = tf.data.Options()
    options.autotune.enabled = False
    return dataset.with_options(options)


@contextmanager
def open_dataset(
    url: str,
    *,
    rank: int = 0,
    size: int = 1,
    batch_size: int | None = 32,
    num_epochs: int | None = None,
    shuffle: bool = True,
    seed: int = 0,
    fields: tuple[str, ...] = ("image", "label"),
    normalize: bool = True,
    in_memory: bool = False,
    reader: Reader | None = None,
):
    """Yield a ``tf.data.Dataset`` of this rank's shard; stops the reader on exit.

    ``num_epochs=None`` repeats forever. Images come as float32 in [0, 1] with a channel axis
    (``normalize=True``), labels as int32. ``in_memory``: load the shard once and serve it from
    memory, reshuffled every epoch (always for a ``synthetic:`` split). ``reader``: Petastorm's,
    or pyarrow's (``hvdflow.training.parquet_reader``), which unpickles nothing.
    """
    import tensorflow as tf

    in_memory = in_memory or is_synthetic(url)
    reader = _checked_reader(reader)
    # Our map functions are graph code as written (their one branch tests a static shape).
    as_written = tf.autograph.experimental.do_not_convert
    if in_memory:
        arrays = load_shard(url, rank=rank, size=size, fields=fields, reader=reader)
        dataset = tf.data.Dataset.from_tensor_slices(arrays)
        if shuffle:
            dataset = dataset.shuffle(len(arrays[0]), seed=seed, reshuffle_each_iteration=True)
        dataset = dataset.repeat(num_epochs)
        if batch_size:  # batch first: one vectorised normalisation per batch, not per image
            dataset = dataset.batch(batch_size)
        if normalize:
            dataset = dataset.map(as_written(normalized_batch), num_parallel_calls=tf.data.AUTOTUNE)
        yield without_autotuning(dataset.prefetch(tf.data.AUTOTUNE))
        return
    if reader == "pyarrow":
        # Batched before anything else, so that every step after is one call per batch.
        batching = {"rank": rank, "size": size, "num_epochs": num_epochs, "shuffle": shuffle}
        batches = batch_size or parquet_reader.SHUFFLE_ROWS
        dataset = _pyarrow_batches(url, fields, batch_size=batches, seed=seed, **batching)
        if normalize:
            dataset = dataset.map(as_written(_normalized_rows), num_parallel_calls=tf.data.AUTOTUNE)
        if not batch_size:
            dataset = dataset.unbatch()
        yield without_autotuning(dataset.prefetch(tf.data.AUTOTUNE))
        return

    from petastorm import make_reader
    from petastorm.tf_utils import make_petastorm_dataset

    run_petastorm_unconverted()
    petastorm_reader = make_reader(
        url,
        schema_fields=list(fields),
        cur_shard=rank,
        shard_count=size,
        num_epochs=num_epochs,
        shuffle_row_groups=shuffle,
        seed=seed,
        workers_count=2,
        filesystem=filesystem_for(url),
    )
    try:
        dataset = make_petastorm_dataset(petastorm_reader)
        if normalize:
            dataset = dataset.map(
                as_written(_normalized_example), num_parallel_calls=tf.data.AUTOTUNE
            )
        if shuffle:
            dataset = dataset.shuffle(1024, seed=seed)
        if batch_size:
            dataset = dataset.batch(batch_size)
        yield without_autotuning(dataset.prefetch(tf.data.AUTOTUNE))
    finally:
        petastorm_reader.stop()
        petastorm_reader.join()
