"""The preprocessing task's cache: a key that follows the code and the input, a result that is
still there."""

from __future__ import annotations

import importlib.metadata

import numpy as np
import pytest
from PIL import Image

from hvdflow.flows.prefect.preprocess import dataset_cache_key, preprocessed
from hvdflow.tasks.images.listing import Listing
from hvdflow.tasks.preprocess import PreprocessConfig, sources


def write_images(root, per_class=6, classes=("cat", "dog")):
    """A class-folder tree of small PNGs."""
    rng = np.random.default_rng(0)
    for name in classes:
        (root / name).mkdir(parents=True)
        for i in range(per_class):
            pixels = rng.integers(0, 255, (10, 10), dtype=np.uint8)
            Image.fromarray(pixels, "L").save(root / name / f"{i}.png")
    return root


@pytest.mark.unit
def test_the_preprocessing_cache_key_follows_the_code_version(tmp_path, monkeypatch):
    config = PreprocessConfig(
        input=str(write_images(tmp_path / "in")),
        input_format="folders",
        image_size=(28, 28),
        output=str(tmp_path),
    )
    key = dataset_cache_key(None, {"config": config})
    assert dataset_cache_key(None, {"config": config}) == key

    keys = {key}
    for code in ("0.1.0+" + "a" * 64, "0.1.0+" + "b" * 64, "0.2.0+" + "b" * 64):
        monkeypatch.setattr(sources, "code_version", lambda code=code: code)
        keys.add(dataset_cache_key(None, {"config": config}))
    assert len(keys) == 4  # another release, or other preprocessing code: another key


@pytest.mark.unit
def test_the_code_version_is_the_release_and_a_hash_of_the_preprocessing_source():
    release, source_hash = sources.code_version().split("+")
    assert release == importlib.metadata.version("hvdflow")
    assert len(source_hash) == 64 and int(source_hash, 16) >= 0
    listing = Listing([], [("/in/cat/0.png", 3, 1)], ["cat"])
    params = PreprocessConfig(input="x").params()
    assert sources.fingerprint(listing, params) == sources.fingerprint(
        listing, params, code=sources.code_version()
    )
    assert sources.fingerprint(listing, params, code="x") != sources.fingerprint(listing, params)


@pytest.mark.integration
@pytest.mark.parametrize("damage", ["deleted", "rewritten"])
def test_a_cached_dataset_whose_objects_were_deleted_or_rewritten_is_built_again(
    prefect_harness, spark, store, tmp_path, damage
):
    from prefect import flow

    from hvdflow.training.reader import open_dataset

    output = store.config.uri(store.config.key("datasets"))
    config = PreprocessConfig(
        input=str(write_images(tmp_path / "in")),
        input_format="folders",
        output=output,
        image_size=(8, 8),
        np=2,
    )

    @flow
    def preprocess_flow():
        return preprocessed(config)

    first = preprocess_flow()
    parts = [k for k in store.list_keys(store.config.key("datasets")) if k.endswith(".parquet")]
    assert any("/train/" in k for k in parts)
    for key in parts:  # the part files only: the manifest and the metadata stay
        uri = f"s3://{store.config.bucket}/{key}"
        if damage == "deleted":
            store.delete(uri)
        else:  # the same size, 16 bytes inverted: a copy gone wrong, bits rotted
            data = store.get_bytes(uri)
            middle = len(data) // 2
            flipped = bytes(b ^ 0xFF for b in data[middle : middle + 16])
            store.put_bytes(data[:middle] + flipped + data[middle + 16 :], uri)

    again = preprocess_flow()
    assert not again.reused and again.path != first.path  # a new attempt, not the cache
    assert (again.train_rows, again.val_rows) == (first.train_rows, first.val_rows)
    with open_dataset(again.train_url, batch_size=None, num_epochs=1, shuffle=False) as rows:
        assert sum(1 for _ in rows) == again.train_rows
    assert preprocess_flow().path == again.path  # and that one is the cache from now on
