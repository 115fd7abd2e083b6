"""Petastorm dataset to ``tf.data``, sharded by rank: how training ranks read preprocessed data.

Petastorm shards by row group: rank ``r`` of ``n`` reads every n-th row group, so across ranks
each row is read exactly once per epoch. Shards can differ by a row group, so training should
fix ``steps_per_epoch`` (``steps_per_epoch()`` below) rather than run each shard to its end:
Horovod ranks that take different numbers of steps wait on each other forever.
"""

from __future__ import annotations

import posixpath
from contextlib import contextmanager


def filesystem_for(url: str):
    """A pyarrow filesystem for ``s3://`` URLs on the configured endpoint (None for local)."""
    if not url.startswith("s3://"):
        return None
    import warnings

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

    from infra.storage.object_store import s3_endpoint

    endpoint = s3_endpoint()
    client_kwargs = {"endpoint_url": endpoint} if endpoint else {}
    # petastorm 0.13 with pyarrow 14 fails on storage_options; a wrapped s3fs works.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # deprecated, and the only way here
        return _S3FSWrapper(s3fs.S3FileSystem(client_kwargs=client_kwargs))


def steps_per_epoch(rows: int, size: int, batch_size: int) -> int:
    """Steps every rank can take each epoch with data to spare: the same number on all ranks."""
    return max(1, rows // (size * batch_size))


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
):
    """Yield a ``tf.data.Dataset`` of this rank's shard; stops the reader on exit.

    ``num_epochs=None`` repeats forever. Images come as float32 in [0, 1] with a channel axis
    (``normalize=True``), labels as int32.
    """
    import tensorflow as tf
    from petastorm import make_reader
    from petastorm.tf_utils import make_petastorm_dataset

    reader = make_reader(
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
        dataset = make_petastorm_dataset(reader)
        if normalize:

            def to_example(row):
                image = tf.cast(row.image, tf.float32) / 255.0
                if len(row.image.shape) == 2:
                    image = image[..., tf.newaxis]
                return image, tf.cast(row.label, tf.int32)

            dataset = dataset.map(to_example, num_parallel_calls=tf.data.AUTOTUNE)
        if shuffle:
            dataset = dataset.shuffle(1024, seed=seed)
        if batch_size:
            dataset = dataset.batch(batch_size)
        yield dataset.prefetch(tf.data.AUTOTUNE)
    finally:
        reader.stop()
        reader.join()
