"""Parquet files of images, local or ``s3://``: a row group read back with ranged requests, and
a task's part file written as Arrow tables come, whole or not at all (storage.open_for_write).
"""

from __future__ import annotations

import functools
import sys

from hvdflow.infra.storage.access import S3Access
from hvdflow.infra.storage.files import open_for_write
from hvdflow.infra.storage.uris import is_s3

# The columns a Parquet file of images has: encoded image bytes, and what the reports show.
IMAGE_COLUMN, SOURCE_COLUMN = "image", "source"


def open_input(path: str, access: S3Access | None):
    """A seekable binary file for a local path or an ``s3://`` object (read in ranges)."""
    if not is_s3(path):
        return open(path, "rb")
    return _s3fs(access or S3Access.from_env()).open(path.removeprefix("s3://"), "rb")


@functools.lru_cache(maxsize=4)
def _s3fs(access: S3Access):
    """One s3fs filesystem per store and credentials (it keeps a pool and an event loop thread)."""
    import s3fs

    client_kwargs = {"region_name": access.region}
    if access.endpoint_url:
        client_kwargs["endpoint_url"] = access.endpoint_url
    return s3fs.S3FileSystem(
        key=access.access_key_id,
        secret=access.secret_access_key,
        token=access.session_token,
        client_kwargs=client_kwargs,
        skip_instance_cache=True,
    )


def read_row_group(path: str, row_group: int, access: S3Access | None):
    """(sources, encoded images) of one row group of the Parquet file at ``path``."""
    import pyarrow.parquet as pq

    with open_input(path, access) as f:
        table = pq.ParquetFile(f).read_row_group(row_group, columns=[SOURCE_COLUMN, IMAGE_COLUMN])
    return table.column(SOURCE_COLUMN).to_pylist(), table.column(IMAGE_COLUMN).to_pylist()


class ParquetPart:
    """A part file written as Arrow tables come (storage.open_for_write): created at the first
    table, complete at ``url`` only once closed; ``abort`` (in an ``except``) leaves nothing."""

    def __init__(self, url: str, schema, access: S3Access | None, client, **options):
        self.url, self.schema, self.access, self.client = url, schema, access, client
        self.options = options  # for pyarrow's ParquetWriter
        self._context = None
        self._writer = None

    def write(self, table, row_group_size: int | None = None) -> None:
        import pyarrow.parquet as pq

        if self._writer is None:
            self._context = open_for_write(self.url, self.access, self.client)
            self._writer = pq.ParquetWriter(self._context.__enter__(), self.schema, **self.options)
        self._writer.write_table(table, row_group_size=row_group_size)

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._context.__exit__(None, None, None)

    def abort(self) -> None:
        if self._context is not None:
            self._context.__exit__(*sys.exc_info())
