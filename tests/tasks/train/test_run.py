"""Training tracked in a real MLflow server over HTTP, with the registry's aliases."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from mlflow import MlflowClient

from hvdflow.infra.services import free_port
from hvdflow.tasks.train.origin import RunOrigin
from hvdflow.tasks.train.run import ModelRejected, TrainConfig, train_and_track
from hvdflow.tasks.train.tags import REJECTED_TAG
from tests.helpers import wait_for_no_ranks


@pytest.mark.slow
def test_a_run_logs_params_metrics_artifacts_and_registers_a_champion(
    spark, mlflow_server, digits_dataset, tmp_path
):
    config = TrainConfig(
        training={"epochs": 3, "learning_rate": 0.01, "eval_every": 0.5},
        launcher={"np": 2},
        tracking={"experiment": "tests-train", "registered_model_name": "tests-digits"},
    )
    origin = RunOrigin("airflow", "hvdflow_pipeline/manual__once", "Airflow DAG run")
    result = train_and_track(
        spark,
        config,
        digits_dataset,
        mlflow_server.tracking_uri,
        log_dir=str(tmp_path),
        origin=origin,
    )
    client = MlflowClient(mlflow_server.tracking_uri)
    run = client.get_run(result.run_id)
    params = run.data.params
    assert params["np"] == "2" and params["model"] == "digits_mlp"
    assert params["dataset_fingerprint"] == digits_dataset.fingerprint
    # Adam follows np by the square root, reached by a one-epoch warm-up.
    assert params["base_learning_rate"] == "0.01" and params["lr_scaling"] == "sqrt"
    assert float(params["scaled_learning_rate"]) == pytest.approx(0.01 * 2**0.5)
    assert params["optimizer"] == "adam" and params["warmup_epochs"] == "1.0"
    assert params["horovod_autotune"] == "False"
    rates = [m.value for m in client.get_metric_history(result.run_id, "learning_rate")]
    assert rates[0] == pytest.approx(0.01 * 2**0.5, rel=0.05)  # warmed up by epoch 1's end
    assert rates[1:] == [pytest.approx(0.01 * 2**0.5)] * 2

    for key in ("loss", "accuracy", "val_loss", "val_accuracy", "epoch_time_s", "input_wait_share"):
        history = client.get_metric_history(result.run_id, key)
        assert sorted(m.step for m in history) == [0, 1, 2], key  # one point per epoch
    assert len(client.get_metric_history(result.run_id, "epoch_time_log_s")) == 3
    # The evaluations every half epoch, at the optimizer's step: accuracy over the training.
    interval = client.get_metric_history(result.run_id, "interval_val_accuracy")
    steps = [m.step for m in sorted(interval, key=lambda m: m.step)]
    assert len(steps) >= 6 and steps == sorted(set(steps)) and steps[0] > 0
    assert max(m.value for m in interval) > 0.5
    assert run.data.metrics["images_per_s"] > 0 and run.data.metrics["wall_clock_s"] > 0
    assert run.data.metrics["val_accuracy"] > 0.5  # it learned the digits
    assert any(k.startswith("system/") for k in run.data.metrics)  # system metrics on

    artifacts = {a.path for a in client.list_artifacts(result.run_id, "dataset")}
    assert artifacts == {"dataset/labels.json", "dataset/quarantine.csv"}
    assert [a.path for a in client.list_artifacts(result.run_id, "logs")] == ["logs/driver.log"]
    log = client.download_artifacts(result.run_id, "logs/driver.log", str(tmp_path / "dl"))
    assert "[1,0]<stdout>:Epoch 1/3" in open(log).read()

    assert result.aliases == ["candidate", "champion"]
    version = client.get_model_version_by_alias("tests-digits", "champion")
    assert version.version == result.model_version and version.run_id == result.run_id
    # Its lineage is searchable: tags, not only the description.
    assert version.tags["hvdflow.dataset_fingerprint"] == digits_dataset.fingerprint
    assert version.tags["hvdflow.dataset"] == digits_dataset.path
    assert (version.tags["hvdflow.np"], version.tags["hvdflow.engine"]) == ("2", "horovod")
    assert float(version.tags["hvdflow.val_accuracy"]) == pytest.approx(
        run.data.metrics["val_accuracy"], abs=1e-6
    )
    found = client.search_model_versions(
        f"name = 'tests-digits' and tags.`hvdflow.dataset_fingerprint` = "
        f"'{digits_dataset.fingerprint}'"
    )
    assert version.version in {v.version for v in found}
    # mlflow.models.evaluate on the validation split: its metrics and confusion matrix on the
    # run, the headline figures on the version.
    assert run.data.metrics["accuracy_score"] > 0.5
    assert float(version.tags["hvdflow.evaluation.accuracy_score"]) == pytest.approx(
        run.data.metrics["accuracy_score"], abs=1e-6
    )
    assert {"f1_score", "precision_score", "recall_score"} <= set(run.data.metrics)
    assert "confusion_matrix.png" in {a.path for a in client.list_artifacts(result.run_id)}
    assert version.tags["hvdflow.evaluation.confusion_matrix"].endswith("confusion_matrix.png")
    assert wait_for_no_ranks() == []

    # The same orchestrator run's training step again (its Airflow worker died after the
    # first one had finished, say): the finished run answers; nothing trains or registers.
    versions_before = client.search_model_versions("name = 'tests-digits'")
    uri = mlflow_server.tracking_uri
    again = train_and_track(spark, config, digits_dataset, uri, origin=origin)
    assert (again.run_id, again.model_version) == (result.run_id, result.model_version)
    assert again.aliases == ["candidate", "champion"]
    assert again.history["val_accuracy"] == result.history["val_accuracy"]
    assert again.epoch_times == pytest.approx(result.epoch_times)
    assert len(client.search_model_versions("name = 'tests-digits'")) == len(versions_before)
    assert wait_for_no_ranks() == []

    # A worse model becomes the candidate but does not take the champion's place.
    worse = train_and_track(
        spark,
        TrainConfig(
            training={"epochs": 1, "learning_rate": 0.002},  # worse, but better than chance
            launcher=config.launcher,
            tracking=config.tracking,
        ),
        digits_dataset,
        mlflow_server.tracking_uri,
    )
    assert worse.aliases == ["candidate"]
    assert (
        client.get_model_version_by_alias("tests-digits", "candidate").version
        == worse.model_version
    )
    assert (
        client.get_model_version_by_alias("tests-digits", "champion").version
        == result.model_version
    )

    # A registry consumer in a fresh process predicts classes for a batch of dataset images.
    out = consume_champion("tests-digits", digits_dataset.val_url, mlflow_server.tracking_uri)
    assert out["batch"] == 32
    # The class names travel inside the model: the dataset's, by label index.
    assert out["names"] == [digits_dataset.class_names[c] for c in out["classes"]]
    assert out["accuracy"] > 0.5


def consume_champion(model: str, val_url: str, tracking_uri: str) -> dict:
    """What a registry consumer sees in a fresh process without horovod: CONSUMER's output."""
    consumer = subprocess.run(
        [sys.executable, "-c", CONSUMER.replace("tests-digits@", f"{model}@"), val_url],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "MLFLOW_TRACKING_URI": tracking_uri},
    )
    assert consumer.returncode == 0, consumer.stderr[-3000:]
    return json.loads(consumer.stdout.strip().splitlines()[-1])


CONSUMER = """
import json, sys, tempfile
import mlflow.pyfunc, numpy as np
from hvdflow.training.reader import open_dataset
import pandas as pd
with tempfile.TemporaryDirectory() as dst:  # without dst_path MLflow's copy stays in /tmp
    model = mlflow.pyfunc.load_model("models:/tests-digits@champion", dst_path=dst)
with open_dataset(sys.argv[1], batch_size=32, num_epochs=1, shuffle=False) as ds:
    images, labels = next(iter(ds))
# Images already prepared as the network takes them: the compatible input.
out = model.predict(pd.DataFrame({"pixels": [image.tolist() for image in images.numpy()]}))
classes = out["class_index"].to_numpy(int)
print(json.dumps({"batch": len(classes), "classes": classes.tolist(),
                  "names": out["class_name"].tolist(),
                  "accuracy": float((classes == labels.numpy()).mean())}))
"""


@pytest.mark.slow
def test_a_diverged_model_is_marked_failed_and_never_published(
    spark, mlflow_server, digits_dataset
):
    # Adam scaled linearly with no warm-up, as the pipeline's defaults once were, but hotter.
    config = TrainConfig(
        training={
            "epochs": 3,
            "optimizer": "adam",
            "learning_rate": 5.0,
            "lr_scaling": "linear",
            "warmup_epochs": 0,
        },
        launcher={"np": 2},
        tracking={"experiment": "tests-rejected", "registered_model_name": "tests-rejected"},
    )
    with pytest.raises(ModelRejected) as err:
        train_and_track(spark, config, digits_dataset, mlflow_server.tracking_uri)
    message = str(err.value)
    assert "no better than chance (0.100 for 10 classes" in message
    assert "learning rate 10 (5 x 2 ranks, lr_scaling 'linear'; no warm-up)" in message
    assert "lower training.learning_rate" in message

    client = MlflowClient(mlflow_server.tracking_uri)
    experiment = client.get_experiment_by_name("tests-rejected")
    (run,) = client.search_runs([experiment.experiment_id])
    assert run.info.status == "FAILED"
    assert run.data.tags[REJECTED_TAG] in message
    # Stopped after the epoch that diverged, which is still in the run's metrics.
    assert run.data.tags["hvdflow.stopped"].startswith("training diverged in epoch 1")
    assert [m.step for m in client.get_metric_history(run.info.run_id, "loss")] == [0]
    # Not registered: no version of the model exists, so no first version became champion.
    assert client.search_model_versions("name = 'tests-rejected'") == []
    assert wait_for_no_ranks() == []


@pytest.mark.integration
def test_an_unreachable_tracking_server_fails_before_training(spark, digits_dataset):
    uri = f"http://127.0.0.1:{free_port()}"
    jobs_before = _spark_jobs_so_far(spark)
    with pytest.raises(RuntimeError) as err:
        train_and_track(spark, TrainConfig(), digits_dataset, uri)
    assert f"MLflow tracking server at {uri} is unreachable" in str(err.value)
    assert "Nothing was trained" in str(err.value)
    assert _spark_jobs_so_far(spark) == jobs_before  # no Spark job was started
    assert wait_for_no_ranks(0.1) == []


def _spark_jobs_so_far(spark) -> int:
    """Every job this Spark application ran, whatever its group (Spark's status store)."""
    return spark.sparkContext._jsc.sc().statusStore().jobsList(None).size()


@pytest.mark.slow
def test_the_tf_engine_with_mixed_precision_registers_a_champion_a_consumer_loads(
    spark, mlflow_server, digits_dataset, tmp_path
):
    config = TrainConfig(
        training={"epochs": 2, "learning_rate": 0.01, "mixed_precision": True},
        launcher={"np": 2, "engine": "tf_collective"},
        tracking={"experiment": "tests-tf-engine", "registered_model_name": "tests-digits-tf"},
    )
    result = train_and_track(spark, config, digits_dataset, mlflow_server.tracking_uri)
    client = MlflowClient(mlflow_server.tracking_uri)
    params = client.get_run(result.run_id).data.params
    assert params["engine"] == "tf_collective" and params["mixed_precision"] == "True"
    assert params["horovod_fp16_compression"] == "False"
    for key in ("loss", "val_accuracy", "epoch_time_s", "input_wait_share"):
        steps = sorted(m.step for m in client.get_metric_history(result.run_id, key))
        assert steps == [0, 1], key
    assert result.aliases == ["candidate", "champion"]

    out = consume_champion("tests-digits-tf", digits_dataset.val_url, mlflow_server.tracking_uri)
    assert out["batch"] == 32 and out["accuracy"] > 0.3
    assert wait_for_no_ranks() == []
