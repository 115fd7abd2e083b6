"""The staging task's cache: a key that follows the content, weights that are still intact."""

from __future__ import annotations

import hashlib
from types import SimpleNamespace

import pytest

from hvdflow.flows.prefect.weights import resolved_source_key, stage_weights_for


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
