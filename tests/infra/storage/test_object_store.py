import os
import time

import pytest

from infra.services import free_port
from infra.storage.object_store import (
    ObjectStore,
    ObjectStoreConfig,
    ObjectStoreError,
    file_suffix,
    parse_uri,
)


@pytest.mark.unit
def test_config_comes_from_the_standard_aws_variables(monkeypatch):
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")
    monkeypatch.setenv("HVDFLOW_BUCKET", "team-bucket")
    monkeypatch.setenv("HVDFLOW_PREFIX", "/runs/")
    config = ObjectStoreConfig.from_env()
    assert (config.endpoint_url, config.bucket, config.prefix) == (
        "http://127.0.0.1:9",
        "team-bucket",
        "runs",
    )
    assert config.uri(config.key("weights", "a.h5")) == "s3://team-bucket/runs/weights/a.h5"
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", "http://127.0.0.1:10")
    assert ObjectStoreConfig.from_env().endpoint_url == "http://127.0.0.1:10"


@pytest.mark.unit
def test_config_holds_no_credentials(monkeypatch):
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "s3cr3t-value")
    assert "s3cr3t-value" not in repr(ObjectStoreConfig.from_env().model_dump())


@pytest.mark.unit
def test_content_addressed_names_keep_the_compound_suffix_keras_reads():
    assert file_suffix("s3://b/digits_mlp.weights.h5") == ".weights.h5"
    assert file_suffix("/tmp/vgg16_notop.h5") == ".h5"
    assert file_suffix("https://host/x.tar.gz?sig=1") == ".tar.gz"


@pytest.mark.unit
def test_parse_uri_rejects_what_is_not_an_object_uri():
    assert parse_uri("s3://b/k/x.h5") == ("b", "k/x.h5")
    with pytest.raises(ValueError, match="expected s3://BUCKET/KEY"):
        parse_uri("/tmp/x.h5")


@pytest.mark.integration
def test_objects_round_trip_on_the_real_server(store):
    uri = store.config.uri(store.config.key("notes", "a.json"))
    store.put_bytes(b'{"a": 1}', uri)
    assert store.get_bytes(uri) == b'{"a": 1}'
    assert store.head(uri)["size"] == 8
    assert store.list_keys(store.config.key("notes")) == [store.config.key("notes", "a.json")]


@pytest.mark.integration
def test_a_missing_object_fails_naming_its_uri(store):
    uri = store.config.uri(store.config.key("nope.h5"))
    assert store.head(uri) is None
    with pytest.raises(
        ObjectStoreError, match=f"{uri} does not exist at {store.config.endpoint_url}"
    ):
        store.get_bytes(uri)


@pytest.mark.unit
def test_an_unreachable_store_is_retried_then_fails_naming_the_endpoint(monkeypatch):
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "k")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "s3cr3t-value")
    endpoint = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    store = ObjectStore(ObjectStoreConfig(endpoint_url=endpoint, attempts=3, connect_timeout_s=1))
    started = time.monotonic()
    with pytest.raises(ObjectStoreError) as err:
        store.get_bytes("s3://hvdflow/x.h5")
    message = str(err.value)
    assert f"object store at {endpoint} is unreachable after 3 attempts" in message
    assert "hvdflow up" in message and "AWS_ENDPOINT_URL" in message
    assert "s3cr3t-value" not in message
    assert time.monotonic() - started > 0.5  # backoff between the attempts


@pytest.mark.integration
def test_the_embedded_server_is_stopped_and_leaves_no_process(tmp_path):
    from infra.services.seaweed import SeaweedServer

    with SeaweedServer(tmp_path) as server:
        pid = server.process.pid
        assert server.credentials.secret_access_key not in repr(server.credentials)
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


@pytest.mark.integration
def test_aws_keys_in_the_users_environment_do_not_lock_out_the_embedded_server(
    tmp_path, monkeypatch
):
    # SeaweedFS makes AWS_* keys in its environment its only identity; a user's own keys
    # must not leak into it.
    from infra._env import temporary_env
    from infra.services.seaweed import SeaweedServer

    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "someone-elses-key")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "someone-elses-secret")
    with SeaweedServer(tmp_path) as server, temporary_env(server.env()):
        store = ObjectStore(ObjectStoreConfig(endpoint_url=server.endpoint_url))
        store.ensure_bucket()
        uri = store.config.uri("x.json")
        store.put_bytes(b"{}", uri)
        assert store.get_bytes(uri) == b"{}"
