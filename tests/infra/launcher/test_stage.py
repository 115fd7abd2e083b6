"""Rank 0's result in pieces: what the barrier stage cuts and the driver joins again."""

from __future__ import annotations

import random

import pytest

from hvdflow.infra.launcher._driver import chunks, joined

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("size", [0, 1, 999, 1000, 1001, 3500])
def test_pieces_join_back_into_the_bytes_in_any_order(size):
    data = random.Random(size).randbytes(size)
    pieces = list(chunks(data, size=1000))
    assert all(len(piece) <= 1000 for _, piece in pieces)
    assert len(pieces) == max(1, -(-size // 1000))
    random.Random(0).shuffle(pieces)
    assert joined(pieces) == data


def test_no_rows_is_no_result_and_a_missing_piece_is_an_error():
    assert joined([]) is None
    pieces = list(chunks(b"x" * 2500, size=1000))
    with pytest.raises(RuntimeError, match=r"pieces \[0, 2\]: some are missing or repeated"):
        joined([pieces[0], pieces[2]])
