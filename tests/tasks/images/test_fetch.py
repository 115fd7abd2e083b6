"""The one Fetcher that preprocessing and scoring read with: every kind of listed item, in order,
and a row group never fetched beside others."""

from __future__ import annotations

import io
import threading
from concurrent.futures import ThreadPoolExecutor

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from PIL import Image

from hvdflow.tasks.images import sniff
from hvdflow.tasks.images.decode import Bad, Good
from hvdflow.tasks.images.fetch import Fetcher, fetch_ahead
from hvdflow.tasks.images.listing import Item

pytestmark = pytest.mark.unit


def png_bytes(value: int, size=(6, 4)) -> bytes:
    out = io.BytesIO()
    Image.new("L", size, value).save(out, "PNG")
    return out.getvalue()


def test_files_row_groups_and_listed_problems_come_out_in_order(tmp_path):
    (tmp_path / "one.png").write_bytes(png_bytes(200))
    dataset = tmp_path / "part-00000.parquet"
    table = pa.table(
        {"source": ["a", "b", "c"], "image": [png_bytes(50), None, b"junk"], "label": [0, 1, 2]}
    )
    with pq.ParquetWriter(dataset, table.schema) as writer:
        writer.write_table(table.slice(0, 2))  # row group 0: a, b
        writer.write_table(table.slice(2, 1))  # row group 1: c
    items = [
        Item("one.png", "cat", str(tmp_path / "one.png")),
        Item(str(dataset), "", str(dataset), row_group=0),
        Item("gone.png", "cat", str(tmp_path / "gone.png"), problem="broken symbolic link"),
        Item(str(dataset), "", str(dataset), row_group=1),
    ]
    with Fetcher(None) as fetcher:
        records = list(fetcher.records(items, (4, 6), "L", 10**6))

    assert [type(r).__name__ for r in records] == ["Good", "Good", "Bad", "Bad", "Bad"]
    first, second = records[:2]
    assert isinstance(first, Good) and (first.source, first.label) == ("one.png", "cat")
    assert (first.image == 200).all() and first.image.shape == (4, 6)
    assert isinstance(second, Good) and (second.source, second.label) == ("a", "")
    assert (second.image == 50).all()
    assert records[2:] == [
        Bad("b", "empty file (0 bytes)"),  # a null image in the dataset
        Bad("gone.png", "broken symbolic link"),  # never read
        Bad("c", sniff.TEXT),
    ]


def test_an_item_fetched_alone_waits_for_those_in_flight_and_has_none_beside_it():
    out: list[tuple[int, int]] = []
    when_alone: list[tuple[int, str]] = []

    def fetch(item: int) -> int:
        if item == 0:
            when_alone.append((len(out), threading.current_thread().name))
        return item * 10

    with ThreadPoolExecutor(4, thread_name_prefix="fetch") as pool:
        for pair in fetch_ahead([1, 2, 0, 3], fetch, pool, alone=lambda item: item == 0):
            out.append(pair)

    assert out == [(1, 10), (2, 20), (0, 0), (3, 30)]
    # Fetched in the caller's thread, once 1 and 2 were handed over.
    assert when_alone == [(2, threading.current_thread().name)]
