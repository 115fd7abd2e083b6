"""The embedded MLflow server with its login: refused without it, and everything works with it."""

from __future__ import annotations

import os

import pytest
import requests

from hvdflow.infra._env import temporary_env
from hvdflow.infra.services.mlflow_server import MlflowServer
from hvdflow.infra.storage.object_store import ObjectStore, ObjectStoreConfig

pytestmark = pytest.mark.integration

BUCKET = "hvdflow-mlflow-auth"


@pytest.fixture(scope="module")
def auth_server(seaweed, tmp_path_factory):
    """A tracking server that requires a login, its artifacts proxied to the session's S3."""
    ObjectStore(ObjectStoreConfig(bucket=BUCKET, endpoint_url=seaweed.endpoint_url)).ensure_bucket()
    server = MlflowServer(
        tmp_path_factory.mktemp("mlflow-auth"), f"s3://{BUCKET}/artifacts", seaweed.env(), auth=True
    ).start()
    try:
        yield server
    finally:
        server.stop()


def test_the_api_refuses_a_request_without_the_login_or_with_a_wrong_one(auth_server):
    url = f"{auth_server.tracking_uri}/api/2.0/mlflow/experiments/search?max_results=1"
    env = auth_server.env()
    admin = (env["MLFLOW_TRACKING_USERNAME"], env["MLFLOW_TRACKING_PASSWORD"])
    assert requests.get(url, timeout=10).status_code == 401
    assert requests.get(url, auth=(admin[0], "not-the-password"), timeout=10).status_code == 401
    assert requests.get(url, auth=("someone", admin[1]), timeout=10).status_code == 401
    assert requests.get(url, auth=admin, timeout=10).status_code == 200
    # Artifacts go through the same login.
    artifacts = f"{auth_server.tracking_uri}/api/2.0/mlflow-artifacts/artifacts"
    assert requests.get(artifacts, timeout=10).status_code == 401
    assert requests.get(artifacts, auth=admin, timeout=10).status_code == 200


def test_the_admin_logs_a_run_and_an_artifact_and_registers_a_version_with_an_alias(
    auth_server, seaweed, tmp_path
):
    import mlflow
    from mlflow import MlflowClient

    notes = tmp_path / "notes.txt"
    notes.write_text("logged through the login\n")
    with temporary_env(auth_server.env()):
        assert os.environ["MLFLOW_TRACKING_PASSWORD"]  # what a client or a rank gets
        client = MlflowClient(auth_server.tracking_uri)
        experiment_id = client.create_experiment("tests-auth")
        run = client.create_run(experiment_id)
        client.log_param(run.info.run_id, "np", "2")
        client.log_metric(run.info.run_id, "val_accuracy", 0.9, step=0)
        client.log_artifact(run.info.run_id, str(notes), "notes")
        client.set_terminated(run.info.run_id)

        client.create_registered_model("tests-auth-model")
        version = client.create_model_version(
            "tests-auth-model", f"{run.info.artifact_uri}/notes", run_id=run.info.run_id
        )
        client.set_registered_model_alias("tests-auth-model", "champion", version.version)

        champion = client.get_model_version_by_alias("tests-auth-model", "champion")
        assert (champion.version, champion.run_id) == (version.version, run.info.run_id)
        assert client.get_run(run.info.run_id).data.params == {"np": "2"}
        # Through this server, whatever tracking URI an earlier test left in mlflow's globals.
        downloaded = mlflow.artifacts.download_artifacts(
            run_id=run.info.run_id,
            artifact_path="notes/notes.txt",
            dst_path=str(tmp_path / "dl"),
            tracking_uri=auth_server.tracking_uri,
        )
        assert open(downloaded).read() == "logged through the login\n"

    # The artifact went through the server into the object store.
    with temporary_env(seaweed.env()):
        store = ObjectStore(ObjectStoreConfig(bucket=BUCKET, endpoint_url=seaweed.endpoint_url))
        keys = store.list_keys("artifacts/")
    assert [k for k in keys if k.endswith(f"{run.info.run_id}/artifacts/notes/notes.txt")]


def test_a_client_without_the_login_is_told_so(auth_server, monkeypatch):
    from mlflow import MlflowClient
    from mlflow.exceptions import MlflowException

    for name in ("MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD", "MLFLOW_TRACKING_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(MlflowException) as err:
        MlflowClient(auth_server.tracking_uri).search_experiments()
    assert "401" in str(err.value)
