"""Random images in place of a dataset: what a throughput check trains on where there is none.

Horovod's and TensorFlow's own benchmarks time their models on synthetic data so that a
machine's speed can be read without a dataset on it. hvdflow's trainers take one the same way:
a split URL ``synthetic:rows=1024,shape=224x224x3,classes=101,seed=0`` in a ``DataSpec``, which
``training.reader`` answers from memory (every rank its own rows, ``rank::size``, as a sharded
split would give). The labels are random too: accuracy on it means nothing, images/s does.
"""

from __future__ import annotations

import numpy as np

SCHEME = "synthetic:"


def synthetic_url(rows: int, shape: tuple[int, ...], classes: int, seed: int = 0) -> str:
    """The URL of ``rows`` random uint8 images of ``shape`` with labels below ``classes``."""
    return f"{SCHEME}rows={rows},shape={'x'.join(map(str, shape))},classes={classes},seed={seed}"


def is_synthetic(url: str | None) -> bool:
    return bool(url) and url.startswith(SCHEME)


def _parsed(url: str) -> tuple[int, tuple[int, ...], int, int]:
    try:
        values = dict(item.split("=", 1) for item in url[len(SCHEME) :].split(","))
        shape = tuple(int(side) for side in values["shape"].split("x"))
        return int(values["rows"]), shape, int(values["classes"]), int(values.get("seed", 0))
    except (KeyError, ValueError) as e:
        raise ValueError(
            f"synthetic split {url!r} cannot be read ({e!r}): expected "
            f"{synthetic_url(1024, (28, 28, 1), 10)!r} (training.synthetic.synthetic_url)"
        ) from None


def synthetic_shard(url: str, *, rank: int = 0, size: int = 1, fields=("image", "label")):
    """This rank's rows of the synthetic split, as ``reader.load_shard`` returns a stored one."""
    rows, shape, classes, seed = _parsed(url)
    mine = len(range(rank, rows, size))
    rng = np.random.default_rng((seed, rank))
    columns = {
        "image": rng.integers(0, 256, size=(mine, *shape), dtype=np.uint8),
        "label": rng.integers(0, classes, size=mine).astype(np.int32),
    }
    unknown = [f for f in fields if f not in columns]
    if unknown:
        raise ValueError(f"a synthetic split has the fields image and label, not {unknown}")
    return tuple(columns[f] for f in fields)
