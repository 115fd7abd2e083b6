"""Synthetic splits (``training.synthetic``): what the GPU check trains on where no dataset is."""

from __future__ import annotations

import numpy as np
import pytest

from hvdflow.training.reader import load_shard
from hvdflow.training.synthetic import synthetic_url

pytestmark = pytest.mark.unit


def test_ranks_share_the_rows_as_a_sharded_split_would_and_read_them_the_same_twice():
    url = synthetic_url(5, (4, 4, 3), classes=7, seed=1)
    shards = [load_shard(url, rank=r, size=2) for r in (0, 1)]
    assert [len(labels) for _, labels in shards] == [3, 2]
    images, labels = shards[0]
    assert images.shape == (3, 4, 4, 3) and images.dtype == np.uint8
    assert labels.dtype == np.int32 and labels.max() < 7
    again = load_shard(url, rank=0, size=2)
    assert np.array_equal(again[0], images) and np.array_equal(again[1], labels)


def test_an_unreadable_synthetic_url_says_what_one_looks_like():
    with pytest.raises(ValueError, match=r"synthetic:rows=1024,shape=28x28x1"):
        load_shard("synthetic:rows=ten,shape=28x28")
