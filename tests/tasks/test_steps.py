"""The steps' caches: keys that follow the code and the content, results that are still there."""

from __future__ import annotations

import hashlib
import importlib.metadata
from types import SimpleNamespace

import numpy as np
import pytest
from PIL import Image

from hvdflow.tasks.preprocess import PreprocessConfig, sources
from hvdflow.tasks.steps import (
    dataset_cache_key,
    preprocessed,
    resolved_source_key,
    stage_weights_for,
)


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
    config = PreprocessConfig(input=str(write_images(tmp_path / "in")), output=str(tmp_path))
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
    listing = sources.Listing([], [("/in/cat/0.png", 3, 1)], ["cat"])
    params = PreprocessConfig(input="x").params()
    assert sources.fingerprint(listing, params) == sources.fingerprint(
        listing, params, code=sources.code_version()
    )
    assert sources.fingerprint(listing, params, code="x") != sources.fingerprint(listing, params)


@pytest.mark.unit
def test_a_local_weights_file_is_cached_by_its_content_not_its_path(tmp_path):
    first, second = tmp_path / "a.h5", tmp_path / "b.h5"
    first.write_bytes(b"weights")
    second.write_bytes(b"weights")

    def key(path) -> str:
        parameters = {"model": "m", "input_shape": (8, 8, 1), "num_classes": 10}
        return resolved_source_key(None, {**parameters, "source": str(path)})

    assert key(first) == key(second)
    first.write_bytes(b"retrained")
    assert key(first) != key(second)
    assert key(tmp_path / "missing.h5").startswith("unresolved-")  # the task runs, says why


@pytest.mark.integration
def test_a_cached_dataset_whose_objects_were_deleted_is_built_again(
    prefect_harness, spark, store, tmp_path
):
    from prefect import flow

    from hvdflow.training.reader import open_dataset

    output = store.config.uri(store.config.key("datasets"))
    config = PreprocessConfig(
        input=str(write_images(tmp_path / "in")), output=output, image_size=(8, 8), shards=2
    )

    @flow
    def preprocess_flow():
        return preprocessed(config)

    first = preprocess_flow()
    parts = [k for k in store.list_keys(store.config.key("datasets")) if k.endswith(".parquet")]
    assert any("/train/" in k for k in parts)
    for key in parts:  # the part files only: the manifest and the metadata stay
        store.delete(f"s3://{store.config.bucket}/{key}")

    again = preprocess_flow()
    assert not again.reused and again.path != first.path  # a new attempt, not the cache
    assert (again.train_rows, again.val_rows) == (first.train_rows, first.val_rows)
    with open_dataset(again.train_url, batch_size=None, num_epochs=1, shuffle=False) as rows:
        assert sum(1 for _ in rows) == again.train_rows
    assert preprocess_flow().path == again.path  # and that one is the cache from now on


@pytest.mark.integration
def test_cached_weights_that_were_corrupted_or_deleted_are_staged_again(
    prefect_harness, store, tmp_path, monkeypatch
):
    from prefect import flow

    from hvdflow.training.models import build_model

    monkeypatch.setenv("HVDFLOW_BUCKET", store.config.bucket)
    monkeypatch.setenv("HVDFLOW_PREFIX", store.config.prefix)
    path = tmp_path / "w.weights.h5"
    build_model("digits_mlp", seed=3).save_weights(str(path))
    dataset = SimpleNamespace(image_shape=(8, 8), num_classes=10)

    @flow
    def stage_flow():
        return stage_weights_for("digits_mlp", str(path), dataset)

    staged = stage_flow()
    original = store.get_bytes(staged.uri)
    store.put_bytes(b"\0" * len(original), staged.uri)  # corrupted in place, same size
    assert stage_flow() == staged
    assert hashlib.sha256(store.get_bytes(staged.uri)).hexdigest() == staged.sha256

    store.delete(staged.uri)
    assert stage_flow() == staged
    assert store.get_bytes(staged.uri) == original


@pytest.mark.unit
def test_the_training_progress_artifact_moves_with_the_epochs_and_ends_at_100(monkeypatch):
    import logging

    import prefect.artifacts

    from hvdflow.tasks.steps import TRAINING_PROGRESS_KEY, _ProgressArtifact
    from hvdflow.training.epoch_log import epoch_done_line, epoch_started_line

    calls = []
    monkeypatch.setattr(
        prefect.artifacts,
        "create_progress_artifact",
        lambda progress, key, description: (
            calls.append(("create", progress, key, description)) or "artifact-1"
        ),
    )
    monkeypatch.setattr(
        prefect.artifacts,
        "update_progress_artifact",
        lambda artifact_id, progress, description: calls.append(
            ("update", artifact_id, progress, description)
        ),
    )
    progress = _ProgressArtifact(TRAINING_PROGRESS_KEY, "training m", logging.getLogger("t"))
    for text in [epoch_started_line(1, 2), epoch_done_line(1, 2, 1.0, {}), "loss: 0.3"]:
        progress.see(text)
    progress.finish()
    assert calls == [
        ("create", 0.0, "hvdflow-training-progress", "training m: waiting for the first epoch"),
        ("update", "artifact-1", 50.0, "training m: 1 of 2 epochs done"),
        ("update", "artifact-1", 100.0, "training m: finished"),
    ]


@pytest.mark.unit
def test_a_progress_artifact_the_api_refuses_warns_once_and_never_fails_training(
    monkeypatch, caplog
):
    import logging

    import prefect.artifacts

    from hvdflow.tasks.steps import _ProgressArtifact
    from hvdflow.training.epoch_log import epoch_done_line

    def refuse(*args, **kwargs):
        raise ConnectionError("Prefect API unreachable")

    monkeypatch.setattr(prefect.artifacts, "create_progress_artifact", lambda *a, **k: "id-1")
    monkeypatch.setattr(prefect.artifacts, "update_progress_artifact", refuse)
    caplog.set_level(logging.WARNING, "t")
    progress = _ProgressArtifact("k", "training m", logging.getLogger("t"))
    for epoch in (1, 2, 3):
        progress.see(epoch_done_line(epoch, 3, 1.0, {}))
    progress.finish()
    assert [r.getMessage() for r in caplog.records] == [
        "training progress not shown in Prefect: Prefect API unreachable"
    ]
