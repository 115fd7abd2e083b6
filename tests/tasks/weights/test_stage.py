"""Weights staged once to the real object store; ranks load them from the bucket."""

from __future__ import annotations

import logging
import re
import sys
import threading
from contextlib import contextmanager

import cloudpickle
import pytest

from hvdflow import HorovodRunner, LaunchOptions
from hvdflow.infra.storage.object_store import ObjectStoreError
from hvdflow.tasks.weights.stage import OFFLINE_SOURCE, redact, stage_weights
from hvdflow.training.weights import fetch_weights
from tests.helpers import http_server, wait_for_no_ranks

cloudpickle.register_pickle_by_value(sys.modules[__name__])


@contextmanager
def counting_http_server(files: dict[str, bytes]):
    """Serves ``files`` on 127.0.0.1 and counts every request, like a rate-limited public host."""
    requests: list[str] = []

    def respond(request):
        requests.append(request.path)
        return files.get(request.path.split("?")[0])

    with http_server(respond) as port:
        yield f"http://127.0.0.1:{port}", requests


@pytest.fixture(scope="module")
def weights_file(tmp_path_factory):
    from hvdflow.training.models import build_model

    path = tmp_path_factory.mktemp("weights") / "digits_mlp.weights.h5"
    build_model("digits_mlp", seed=7).save_weights(str(path))
    return path.read_bytes()


def load_staged_weights(uri, sha256):
    """Rank code: load the staged file into the model and report its checksum."""
    import horovod.tensorflow as hvd

    from hvdflow.training.models import build_model
    from hvdflow.training.smoke import weights_sha256
    from hvdflow.training.weights import fetch_weights

    hvd.init()
    model = build_model("digits_mlp")
    model.load_weights(fetch_weights(uri, sha256))
    return hvd.allgather_object(weights_sha256(model.get_weights()))


@pytest.mark.slow
def test_one_download_for_the_whole_job_and_none_on_the_second_run(
    spark, store, weights_file, monkeypatch
):
    with counting_http_server({"/models/digits_mlp.weights.h5": weights_file}) as (url, requests):
        source = f"{url}/models/digits_mlp.weights.h5"
        staged = stage_weights("digits_mlp", source, store)
        checksums = HorovodRunner(np=2, options=LaunchOptions(spark=spark)).run(
            load_staged_weights, uri=staged.uri, sha256=staged.sha256
        )
        assert len(requests) == 1

        again = stage_weights("digits_mlp", source, store)
        checksums_again = HorovodRunner(np=2, options=LaunchOptions(spark=spark)).run(
            load_staged_weights, uri=again.uri, sha256=again.sha256
        )
        assert len(requests) == 1  # the second run never touched the source

    assert again == staged
    assert staged.uri.startswith(f"s3://hvdflow-tests/{store.config.prefix}/weights/digits_mlp/")
    assert staged.uri.endswith(f"{staged.sha256}.weights.h5")
    head = store.head(staged.uri)
    assert head["size"] == len(weights_file) == staged.size
    assert head["metadata"]["sha256"] == staged.sha256
    assert head["metadata"]["model"] == "digits_mlp"
    assert len(checksums) == 2 and len(set(checksums)) == 1  # byte-identical on both ranks
    assert checksums_again == checksums
    assert wait_for_no_ranks() == []


@pytest.mark.integration
def test_concurrent_calls_download_once(store, weights_file):
    with counting_http_server({"/w.h5": weights_file}) as (url, requests):
        results = []
        threads = [
            threading.Thread(
                target=lambda: results.append(stage_weights("m", f"{url}/w.h5", store))
            )
            for _ in range(2)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert len(requests) == 1
    assert len(results) == 2 and results[0] == results[1]


@pytest.mark.integration
def test_offline_source_builds_the_model_and_stages_its_weights(store):
    staged = stage_weights("digits_mlp", OFFLINE_SOURCE, store)
    assert staged.source == OFFLINE_SOURCE and staged.size > 1000
    assert stage_weights("digits_mlp", OFFLINE_SOURCE, store) == staged


@pytest.mark.integration
def test_local_file_source(store, weights_file, tmp_path):
    path = tmp_path / "mine.h5"
    path.write_bytes(weights_file)
    staged = stage_weights("digits_mlp", str(path), store)
    assert store.get_bytes(staged.uri) == weights_file


@pytest.mark.integration
def test_credentials_and_tokens_in_the_source_are_never_stored(store, weights_file):
    with counting_http_server({"/w.h5": weights_file}) as (url, _requests):
        secret_url = url.replace("http://", "http://alice:hunter2@") + "/w.h5?X-Amz-Signature=abc"
        staged = stage_weights("m2", secret_url, store)
    assert staged.source == f"{url}/w.h5?<redacted>"
    assert "hunter2" not in str(store.head(staged.uri)["metadata"])
    assert redact("/local/path.h5") == "/local/path.h5"


@pytest.mark.integration
def test_a_source_that_does_not_answer_fails_naming_it(store):
    with counting_http_server({}) as (url, _requests):
        with pytest.raises(RuntimeError, match=f"could not download m3 weights from {url}/x.h5"):
            stage_weights("m3", f"{url}/x.h5", store)


@pytest.mark.integration
def test_checksum_mismatch_downloads_again_then_fails_naming_the_uri(store, weights_file, caplog):
    uri = store.config.uri(store.config.key("weights", "m", "corrupt.h5"))
    store.put_bytes(b"not the staged bytes", uri)
    with caplog.at_level(logging.WARNING), pytest.raises(ObjectStoreError) as err:
        fetch_weights(uri, "0" * 64, store)
    assert f"{uri} does not match its checksum after two downloads" in str(err.value)
    assert caplog.text.count("checksum mismatch") == 1  # one retry, then the error


@pytest.mark.integration
def test_a_missing_weights_object_fails_naming_the_uri(store):
    uri = store.config.uri(store.config.key("weights", "m", "gone.h5"))
    with pytest.raises(ObjectStoreError, match=f"{uri} does not exist"):
        fetch_weights(uri, "0" * 64, store)


@pytest.mark.integration
def test_cached_weights_are_verified_and_reused(store, weights_file, tmp_path):
    path = tmp_path / "w.h5"
    path.write_bytes(weights_file)
    staged = stage_weights("m4", str(path), store)
    first = fetch_weights(staged.uri, staged.sha256, store)
    store.put_bytes(b"replaced", staged.uri)  # the cache, not the bucket, serves the next call
    assert fetch_weights(staged.uri, staged.sha256, store) == first


@pytest.mark.integration
def test_a_replaced_object_fails_the_drivers_checksum_even_with_matching_metadata(
    store, weights_file, tmp_path
):
    import hashlib
    from dataclasses import asdict

    path = tmp_path / "w.h5"
    path.write_bytes(weights_file)
    staged = stage_weights("m6", str(path), store)
    # Someone who can write the bucket swaps the object, with metadata to match the swap.
    forged = tmp_path / "forged.h5"
    forged.write_bytes(b"weights that were never staged")
    forged_sha = hashlib.sha256(forged.read_bytes()).hexdigest()
    store.upload_file(str(forged), staged.uri, metadata={**asdict(staged), "sha256": forged_sha})
    assert store.head(staged.uri)["metadata"]["sha256"] == forged_sha

    # What a rank does with what the driver gave it (its TrainSpec's weights_sha256).
    with pytest.raises(ObjectStoreError) as err:
        fetch_weights(staged.uri, staged.sha256, store)
    assert str(err.value) == (
        f"{staged.uri} does not match its checksum after two downloads (expected sha256 "
        f"{staged.sha256}, got {forged_sha}): the object in the bucket is corrupt or was "
        "replaced; stage the weights again"
    )
    assert not list((tmp_path / "cache" / "weights").glob(f"{staged.sha256}*.h5"))


@pytest.mark.unit
def test_ranks_are_given_the_checksum_the_driver_computed():
    from types import SimpleNamespace

    from hvdflow.tasks.config import TrainingParams
    from hvdflow.tasks.train.spec import training_spec
    from hvdflow.tasks.weights.stage import StagedWeights

    staged = StagedWeights("digits_mlp", "/w.h5", "s3://b/weights/digits_mlp/ab.h5", "ab" * 32, 9)
    dataset = SimpleNamespace(
        train_url="file:///t",
        val_url="file:///v",
        train_rows=10,
        val_rows=2,
        num_classes=10,
        image_shape=(8, 8, 1),
        class_names=tuple(str(i) for i in range(10)),
    )
    spec = training_spec(TrainingParams(), dataset, staged)
    assert (spec.weights_uri, spec.weights_sha256) == (staged.uri, "ab" * 32)


@pytest.mark.integration
def test_a_reference_is_resolved_when_staging_and_only_the_redacted_url_is_kept(
    store, weights_file, monkeypatch
):
    with counting_http_server({"/w.h5": weights_file}) as (url, requests):
        secret_url = url.replace("http://", "http://alice:hunter2@") + "/w.h5?X-Amz-Signature=s1g"
        monkeypatch.setenv("HVDFLOW_TEST_WEIGHTS_URL", secret_url)
        staged = stage_weights("m7", "env:HVDFLOW_TEST_WEIGHTS_URL", store)
    assert requests == ["/w.h5?X-Amz-Signature=s1g"]
    assert staged.source == f"{url}/w.h5?<redacted>"
    assert store.get_bytes(staged.uri) == weights_file
    for record in (str(staged), str(store.head(staged.uri))):
        assert "hunter2" not in record and "s1g" not in record


@pytest.mark.integration
def test_the_same_bytes_at_two_paths_are_one_staged_object(store, weights_file, tmp_path):
    from dataclasses import replace

    from hvdflow.tasks.weights.stage import source_identity

    first, second = tmp_path / "a" / "w.h5", tmp_path / "b" / "copy.h5"
    for path in (first, second):
        path.parent.mkdir()
        path.write_bytes(weights_file)
    staged = stage_weights("m8", str(first), store)
    again = stage_weights("m8", str(second), store)
    assert again == replace(staged, source=str(second))  # where it came from, this time
    assert source_identity("m8", str(first)) == source_identity("m8", str(second))
    assert len(store.list_keys(store.config.key("weights", "sources"))) == 1
    assert store.list_keys(store.config.key("weights", "m8")) == [staged.uri.split("/", 3)[3]]


@pytest.mark.integration
def test_new_bytes_at_the_same_path_are_staged_anew(store, weights_file, tmp_path):
    import hashlib

    from hvdflow.tasks.weights.stage import source_identity
    from hvdflow.training.models import build_model

    path = tmp_path / "w.weights.h5"
    path.write_bytes(weights_file)
    staged = stage_weights("digits_mlp", str(path), store)
    before = source_identity("digits_mlp", str(path))
    build_model("digits_mlp", seed=8).save_weights(str(path))  # retrained, same file name
    retrained = path.read_bytes()

    again = stage_weights("digits_mlp", str(path), store)
    assert again.sha256 == hashlib.sha256(retrained).hexdigest() != staged.sha256
    assert again.uri != staged.uri and store.get_bytes(again.uri) == retrained
    assert store.get_bytes(staged.uri) == weights_file  # what earlier runs used stays
    assert source_identity("digits_mlp", str(path)) != before


@pytest.mark.integration
def test_a_corrupted_staged_object_is_uploaded_again_when_staging_again(
    store, weights_file, tmp_path
):
    import hashlib

    path = tmp_path / "w.h5"
    path.write_bytes(weights_file)
    staged = stage_weights("m9", str(path), store)
    # Bytes flipped in the bucket; the size, and the index pointing at the object, unchanged.
    corrupted = bytes(b ^ 0xFF for b in weights_file[:64]) + weights_file[64:]
    store.put_bytes(corrupted, staged.uri)
    with pytest.raises(ObjectStoreError, match="does not match its checksum"):
        fetch_weights(staged.uri, staged.sha256, store)  # what the ranks see

    again = stage_weights("m9", str(path), store)
    assert (again.uri, again.sha256) == (staged.uri, staged.sha256)
    assert hashlib.sha256(store.get_bytes(staged.uri)).hexdigest() == staged.sha256
    assert fetch_weights(staged.uri, staged.sha256, store)  # the ranks load it now


@pytest.mark.integration
def test_a_large_download_and_upload_report_bytes_and_rates_line_by_line(
    store, caplog, monkeypatch
):
    import functools

    import hvdflow.tasks.weights.stage
    from hvdflow.infra.progress import ByteProgress

    # A line for every chunk instead of one every few seconds, so that a fast machine shows some.
    monkeypatch.setattr(
        hvdflow.tasks.weights.stage, "ByteProgress", functools.partial(ByteProgress, every_s=0.0)
    )
    caplog.set_level(logging.INFO, "hvdflow.tasks.weights.stage")
    big = bytes(range(256)) * (12 * 4096)  # 12 MiB: more than one chunk, a multipart upload
    with counting_http_server({"/big.weights.h5": big}) as (base, _requests):
        staged = stage_weights("vgg16", f"{base}/big.weights.h5", store)
    assert staged.size == len(big)
    lines = [r.getMessage() for r in caplog.records]
    downloading = [line for line in lines if line.startswith("downloading vgg16 weights: ")]
    assert len(downloading) >= 12  # one a MiB chunk, then the total
    # The rate's unit follows the speed: a fast local server reaches GiB/s.
    assert "of 12.0 MiB (" in downloading[0] and re.search(r"\d [KMG]?i?B/s", downloading[0])
    assert downloading[-1].startswith("downloading vgg16 weights: done, 12.0 MiB in ")
    uploading = [line for line in lines if line.startswith("uploading vgg16 weights: ")]
    assert uploading[-1].startswith("uploading vgg16 weights: done, 12.0 MiB in ")
    assert any("of 12.0 MiB (" in line for line in uploading[:-1])
