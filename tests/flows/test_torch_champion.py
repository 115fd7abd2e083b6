"""A PyTorch training through the pipeline (``training.framework: torch``): np=2 on Spark's
barrier tasks, the champion it registers, and that champion in a consumer's hands."""

from __future__ import annotations

import pytest

from tests.tasks.score.helpers import write_digits

pytestmark = [pytest.mark.slow, pytest.mark.torch]
MODEL = "tests-torch-champion"
HELD_OUT = range(1400, 1440)


@pytest.fixture(scope="module")
def torch_champion(prefect_harness, spark, seaweed, mlflow_server, tmp_path_factory):
    """Train and register with the pipeline flow at np=2: (summary, held-out folder, good)."""
    pytest.importorskip("torch", reason="torch is not installed (the classic profile has it)")
    from hvdflow.flows.prefect.pipeline import PipelineParams, pipeline

    root = tmp_path_factory.mktemp("torch-champion")
    write_digits(root / "train", range(1400), bad=False)
    params = PipelineParams(
        data={
            "input": str(root / "train"),
            "input_format": "folders",
            "output": str(root / "datasets"),
        },
        training={"framework": "torch", "epochs": 4},
        launcher={"np": 2},
        tracking={"registered_model_name": MODEL, "experiment": "tests-torch-champion"},
    )
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("MLFLOW_TRACKING_URI", mlflow_server.tracking_uri)
        summary = pipeline(params)
    good = write_digits(root / "heldout", HELD_OUT)
    return summary, root / "heldout", good


def test_np_2_registers_a_torch_champion_with_its_card(torch_champion, mlflow_server):
    from mlflow import MlflowClient

    summary, _heldout, _good = torch_champion
    assert "champion" in summary["aliases"]
    client = MlflowClient(mlflow_server.tracking_uri)
    version = client.get_model_version_by_alias(MODEL, "champion")
    run = client.get_run(version.run_id)
    assert run.data.params["framework"] == "torch"
    assert run.data.params["engine"] == "torch" and run.data.params["np"] == "2"
    # The same card fields as a TensorFlow champion's (tasks.train.model_card).
    tags = version.tags
    assert (tags["hvdflow.engine"], tags["hvdflow.np"]) == ("torch", "2")
    assert float(tags["hvdflow.val_accuracy"]) > 0.8
    assert tags["hvdflow.dataset"] == summary["dataset"] and tags["hvdflow.dataset_fingerprint"]
    # mlflow.models.evaluate ran on the logged pyfunc, as for a TensorFlow champion.
    assert float(tags["hvdflow.evaluation.accuracy_score"]) == pytest.approx(
        float(tags["hvdflow.val_accuracy"]), abs=1e-6
    )
    # Each epoch logged once, by rank 0.
    history = client.get_metric_history(version.run_id, "val_accuracy")
    assert sorted(m.step for m in history) == [0, 1, 2, 3]


def test_the_torch_champion_served_alone_and_as_a_udf_answers_as_hvdflow_score(
    torch_champion, mlflow_server, monkeypatch, spark, tmp_path
):
    from importlib.metadata import version as installed

    from tests.flows.consumers import check_consumer_routes

    monkeypatch.setenv("MLFLOW_TRACKING_URI", mlflow_server.tracking_uri)
    monkeypatch.setenv("HVDFLOW_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("HVDFLOW_CACHE_DIR", str(tmp_path / "cache"))
    _summary, heldout, good = torch_champion
    from mlflow import MlflowClient

    champion = MlflowClient().get_model_version_by_alias(MODEL, "champion").version
    # Exactly one torch, the one that trained it, and no TensorFlow.
    trained_with = [f"torch=={installed('torch')}"]
    check_consumer_routes(MODEL, champion, heldout, good, trained_with, spark, tmp_path)
