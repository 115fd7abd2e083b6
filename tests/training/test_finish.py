"""One registered version per MLflow run: an attempt that finds its run already registered (an
earlier attempt registered, then died before its flow recorded it) does not register again."""

from __future__ import annotations

import mlflow
import pytest
from mlflow import MlflowClient

from hvdflow.training.finish import finish_training, registered_version
from hvdflow.training.optimizers import LearningRatePlan
from hvdflow.training.spec import DataSpec, TrackingSpec, TrainSpec

pytestmark = [pytest.mark.integration, pytest.mark.current]  # MLflow 2 and 3 both

NAME = "finish-once"


def _finish(spec: TrainSpec, log_model):
    return finish_training(
        spec,
        rank=0,
        size=2,
        plan=LearningRatePlan(0.01, 2, "none", 0),
        history={"val_accuracy": [0.9]},
        epoch_times=[1.0],
        train_seconds=1.0,
        steps=10,
        batch=4,
        resumed=None,
        stopped=None,
        registers=True,
        log_model=log_model,
    )


def test_a_run_that_already_registered_a_version_does_not_register_another(
    mlflow_server, monkeypatch
):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", mlflow_server.tracking_uri)
    mlflow.set_tracking_uri(mlflow_server.tracking_uri)
    client = MlflowClient(mlflow_server.tracking_uri)
    experiment = client.create_experiment("finish-once")
    first, other = (client.create_run(experiment).info.run_id for _ in range(2))
    client.create_registered_model(NAME)
    client.create_model_version(NAME, f"runs:/{other}/model", run_id=other)  # version 1
    data = DataSpec("file:///t", "file:///v", 10, 2, 10, (8, 8, 1))
    spec = TrainSpec(data, "digits_mlp", tracking=TrackingSpec(first, None, NAME))

    # The first attempt registers: version 2, of its own run.
    def register():
        made = client.create_model_version(NAME, f"runs:/{first}/model", run_id=first)
        return made.version, {"accuracy": 0.9}

    assert registered_version(NAME, first) is None
    assert _finish(spec, register).model_version == "2"
    assert registered_version(NAME, first) == "2" and registered_version(NAME, other) == "1"
    assert registered_version("another-model", first) is None

    # A second attempt of the same run finds version 2 and registers nothing.
    def must_not_register():
        raise AssertionError("a second version for one run")

    assert _finish(spec, must_not_register).model_version == "2"
    assert len(client.search_model_versions(f"name = '{NAME}'")) == 2


class _Weighty(mlflow.pyfunc.PythonModel):
    """A model of about 256 KiB once pickled: more than the small disk below holds."""

    def __init__(self):
        self.weights = bytes(range(256)) * 1024

    def predict(self, context, model_input):
        return model_input


def test_a_full_disk_while_the_model_is_logged_is_a_temporary_failure_that_says_where(
    mlflow_server, monkeypatch, tmp_path
):
    import tempfile

    from hvdflow.infra.errors import DiskFullError, TransientError
    from tests.helpers import resize_disk, small_disk

    monkeypatch.setenv("MLFLOW_TRACKING_URI", mlflow_server.tracking_uri)
    mlflow.set_tracking_uri(mlflow_server.tracking_uri)
    client = MlflowClient(mlflow_server.tracking_uri)
    run_id = client.create_run(client.create_experiment("finish-disk-full")).info.run_id
    data = DataSpec("file:///t", "file:///v", 10, 2, 10, (8, 8, 1))
    spec = TrainSpec(data, "digits_mlp", tracking=TrackingSpec(run_id, None, "finish-disk-full"))

    def log_model():  # as the trainers' do: MLflow writes the model under TMPDIR first
        with mlflow.start_run(run_id=run_id):
            info = mlflow.pyfunc.log_model(
                name="model", python_model=_Weighty(), registered_model_name="finish-disk-full"
            )
        return str(info.registered_model_version), None

    with small_disk(tmp_path / "tmp", 64) as tmp:
        monkeypatch.setattr(tempfile, "tempdir", str(tmp))  # the rank's TMPDIR
        with pytest.raises(DiskFullError) as failed:
            _finish(spec, log_model)
        message = str(failed.value)
        assert f"the model could not be logged to MLflow run {run_id}" in message, message
        assert f"no space left on device in {tmp}" in message and "TMPDIR" in message
        assert isinstance(failed.value, TransientError)  # the training step tries again
        assert registered_version("finish-disk-full", run_id) is None

        # Room again: the next attempt logs and registers, once.
        resize_disk(tmp, 4096)
        assert _finish(spec, log_model).model_version == "1"
