"""The scoring flow after a real pipeline run: the champion it registered scores held-out images.

The pipeline trains the digits MLP for one epoch on 1,400 of scikit-learn's digits (ranks on
the driver, no staged weights: the cheapest real training); the scoring flow then scores the
other digits, with bad files among them, on the session's Spark, Prefect and MLflow.
"""

from __future__ import annotations

import csv
import os

import numpy as np
import pyarrow.parquet as pq
import pytest

from hvdflow.flows.params import ScoreParams
from tests.helpers import assert_refused_before_any_service
from tests.tasks.score.helpers import BAD_FILES, model_predictions, read_files, write_digits

MODEL = "tests-score-flow"
HELD_OUT = range(1400, 1480)


@pytest.fixture(scope="module")
def champion(prefect_harness, spark, seaweed, mlflow_server, tmp_path_factory):
    """Train and register with the pipeline flow: (champion version, held-out folder, good)."""
    from mlflow import MlflowClient

    from hvdflow.flows.prefect.pipeline import PipelineParams, pipeline

    root = tmp_path_factory.mktemp("score-flow")
    write_digits(root / "train", range(1400), bad=False)
    params = PipelineParams(
        data={
            "input": str(root / "train"),
            "input_format": "folders",
            "output": str(root / "datasets"),
        },
        training={"epochs": 1, "weights_source": ""},
        launcher={"np": -1},
        tracking={"registered_model_name": MODEL, "experiment": "tests-score-flow"},
    )
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("MLFLOW_TRACKING_URI", mlflow_server.tracking_uri)
        summary = pipeline(params)
    assert "champion" in summary["aliases"]
    version = MlflowClient(mlflow_server.tracking_uri).get_model_version_by_alias(MODEL, "champion")
    good = write_digits(root / "heldout", HELD_OUT)
    return version.version, root / "heldout", good


@pytest.fixture
def tracking(mlflow_server, monkeypatch, tmp_path):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", mlflow_server.tracking_uri)
    monkeypatch.setenv("HVDFLOW_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("HVDFLOW_CACHE_DIR", str(tmp_path / "cache"))  # the model's download
    return mlflow_server.tracking_uri


@pytest.mark.slow
@pytest.mark.current
def test_the_champion_scores_held_out_images_and_the_run_is_recorded(champion, tracking, tmp_path):
    from mlflow import MlflowClient
    from prefect.client.orchestration import get_client

    from hvdflow.flows.prefect.scoring import ARTIFACT_KEY, score
    from hvdflow.tasks.score.record import LAST_OUTPUT_TAG, LAST_RUN_TAG

    version, heldout, good = champion
    params = ScoreParams(model={"name": MODEL}, data={"input": str(heldout)})
    summary = score(params)

    # The champion scored; the output went to HVDFLOW_HOME/scores/<model> by default.
    assert summary["model"] == f"models:/{MODEL}/{version}"
    assert summary["model_asked"] == f"models:/{MODEL}@champion"
    assert summary["output"] == str(tmp_path / "home" / "scores" / MODEL)
    assert (summary["scored"], summary["quarantined"]) == (len(good), len(BAD_FILES))
    table = pq.read_table(summary["predictions"]).sort_by("source")
    assert table.column("source").to_pylist() == good  # every good image, exactly once
    images = read_files(heldout, good)
    classes, probabilities = model_predictions(summary["model"], images, (8, 8), "L")
    assert table.column("class_index").to_pylist() == classes.tolist()
    np.testing.assert_allclose(table.column("probability").to_numpy(), probabilities, rtol=1e-5)
    assert set(table.column("class_name").to_pylist()) <= {str(d) for d in range(10)}
    accuracy = np.mean([int(s.split("/")[0]) for s in good] == classes)
    assert accuracy > 0.3  # one epoch of a real model: well above chance (0.1)
    with open(summary["quarantine_path"], newline="") as f:
        assert sorted(r["source"] for r in csv.DictReader(f)) == sorted(BAD_FILES)
    assert not any(e["horovod"] for e in summary["executors"])

    # MLflow: a scoring run saying which version scored what; tags on that version.
    client = MlflowClient(tracking)
    run = client.get_run(summary["mlflow_run_id"])
    assert run.data.params["model_version"] == version
    assert run.data.params["model_uri"] == summary["model"]
    assert run.data.params["input"] == str(heldout)
    assert run.data.params["output"] == summary["output"]
    assert run.data.metrics["images_scored"] == len(good)
    assert run.data.metrics["quarantined"] == len(BAD_FILES)
    for name, count in summary["counts"].items():
        assert run.data.metrics[f"count/{name}"] == count
    assert run.data.tags["hvdflow.kind"] == "scoring"
    tags = client.get_model_version(MODEL, version).tags
    assert tags[LAST_RUN_TAG] == run.info.run_id and tags[LAST_OUTPUT_TAG] == summary["output"]

    # Prefect: the artifact with the model version and the counts per predicted class.
    with get_client(sync_client=True) as prefect:
        artifacts = {a.key: a for a in prefect.read_latest_artifacts()}
    markdown = artifacts[ARTIFACT_KEY].data
    assert f"version **{version}**" in markdown
    assert f"**{len(good)}** images scored, **{len(BAD_FILES)}** quarantined" in markdown
    for name, count in summary["counts"].items():
        assert f"| {name} | {count} |" in markdown


@pytest.mark.slow
@pytest.mark.current
def test_a_missing_alias_fails_the_flow_naming_the_aliases_the_model_has(
    champion, tracking, tmp_path
):
    from hvdflow.flows.prefect.scoring import score

    version, heldout, _good = champion
    params = ScoreParams(model={"name": MODEL, "alias": "production"}, data={"input": str(heldout)})
    state = score(params, return_state=True)
    assert state.is_failed()
    message = str(state.result(raise_on_failure=False))
    assert f"model '{MODEL}' has no alias 'production'; its aliases: " in message
    assert f"champion (version {version})" in message
    assert not (tmp_path / "home" / "scores").exists()  # nothing scored, nothing written


@pytest.mark.unit
@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (
            ["score"],
            "hvdflow score: data.input (--input) is required: the folder or s3://bucket/prefix "
            "of the images to score (or of a Parquet dataset, with --input-format dataset)",
        ),
        (
            ["score", "--input", "/no/such/folder"],
            "hvdflow score: invalid parameter data.input (--input)='/no/such/folder': input "
            "'/no/such/folder' is not an existing folder: give the folder of images "
            "(input_format 'images') or of Parquet files ('dataset')",
        ),
        (
            ["score", "--input", ".", "--version", "latest"],
            "hvdflow score: invalid parameter model.version (--version)='latest': version "
            "'latest' is not a version number: expected e.g. '3' (or leave it empty and give an "
            "alias)",
        ),
        (
            ["score", "--input", ".", "--version", "3", "--alias", "candidate"],
            "hvdflow score: invalid parameter model: alias 'candidate' and version '3' both "
            "given: name one model version, by alias or by number",
        ),
    ],
)
def test_a_bad_score_parameter_is_one_line_exit_2_and_starts_nothing(
    argv, expected, tmp_path, monkeypatch, capfd
):
    assert_refused_before_any_service(argv, expected, tmp_path, monkeypatch, capfd)


@pytest.mark.unit
def test_the_scoring_flow_deploys_with_its_parameters(tmp_path):
    from hvdflow.flows.prefect.scoring import score

    params = ScoreParams(model={"name": "m", "version": "2"}, data={"input": str(tmp_path)})
    deployment = score.to_deployment(
        name="hvdflow-score", cron="0 5 * * *", parameters={"params": params.model_dump()}
    )
    assert deployment.name == "hvdflow-score" and deployment.flow_name == "hvdflow-score"
    assert deployment.parameters["params"]["model"] == {
        "name": "m",
        "alias": "champion",
        "version": "2",
    }
    assert os.fspath(tmp_path) == deployment.parameters["params"]["data"]["input"]


@pytest.mark.slow
@pytest.mark.current
def test_the_champion_served_by_mlflow_alone_or_as_a_udf_answers_as_hvdflow_score(
    champion, tracking, spark, tmp_path
):
    """A registry consumer's routes give what ``hvdflow score`` gives on the same files: the
    model's own requirements in a fresh environment without hvdflow, ``mlflow models serve``,
    image files POSTed as base64; and ``hvdflow.score_udf`` on a DataFrame of image bytes the
    consumer built (joined with their own metadata)."""
    import importlib.metadata

    from hvdflow.serving.package import tensorflow_requirement
    from tests.flows.consumers import check_consumer_routes

    version, heldout, good = champion
    # One TensorFlow distribution, the one that trained it (tensorflow-cpu 2.15 in the classic
    # profile; tensorflow and its Keras 2, tf-keras, in the current one), and no torch.
    trained_with = [tensorflow_requirement()]
    if tensorflow_requirement().startswith("tensorflow=="):
        trained_with.append(f"tf-keras=={importlib.metadata.version('tf-keras')}")
    check_consumer_routes(MODEL, version, heldout, good, trained_with, spark, tmp_path)
