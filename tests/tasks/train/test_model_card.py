"""The registered version's description and the steady-state throughput beside the wall clock."""

from __future__ import annotations

import logging

import pytest

from hvdflow.tasks.train.model_card import (
    describe_version,
    steady_images_per_s,
    version_card,
    version_tags,
)
from hvdflow.tasks.train.origin import RunOrigin

PREFECT_RUN = RunOrigin(
    "prefect", "f-1", "Prefect flow run", "http://127.0.0.1:4200/runs/flow-run/f-1"
)


@pytest.mark.unit
@pytest.mark.parametrize(
    ("epoch_times", "expected"),
    [
        ([9.0, 2.0, 2.0], 500.0),  # the first epoch's warm-up left out
        ([9.0, 1.0, 3.0], 500.0),  # the mean of the others
        ([4.0], 250.0),  # one epoch: that one
        ([], None),
        ([0.0], None),
    ],
)
def test_steady_throughput_leaves_the_warm_up_epoch_out(epoch_times, expected):
    assert steady_images_per_s(1000, epoch_times) == expected


@pytest.mark.unit
def test_the_version_card_says_what_produced_the_version():
    card = version_card(
        dataset_fingerprint="abc123",
        np=-1,
        engine="horovod",
        origin=PREFECT_RUN,
        run_id="r-1",
        steady_images_per_s=2498.94,
        val_accuracy=0.92613,
    )
    assert card.splitlines() == [
        "Trained by the hvdflow pipeline.",
        "",
        "- dataset fingerprint: `abc123`",
        "- np: -1 (1 rank on the driver)",
        "- engine: horovod",
        "- Prefect flow run: [f-1](http://127.0.0.1:4200/runs/flow-run/f-1)",
        "- MLflow run: `r-1`",
        "- val_accuracy (last epoch): 0.9261",
        "- training throughput (steady state): 2498.9 images/s",
    ]
    assert "- np: 2 (2 ranks on the Spark cluster)" in version_card(dataset_fingerprint="x", np=2)


class Registry:
    def __init__(self, refuse: bool = False):
        self.refuse = refuse
        self.descriptions: dict[tuple[str, str], str] = {}
        self.tags: dict[tuple[str, str], dict[str, str]] = {}

    def update_model_version(self, name, version, description=None):
        if self.refuse:
            raise RuntimeError("RESOURCE_DOES_NOT_EXIST")
        self.descriptions[(name, version)] = description

    def set_model_version_tag(self, name, version, key, value):
        self.tags.setdefault((name, version), {})[key] = value


@pytest.mark.unit
def test_describe_version_writes_the_card_and_a_refusal_only_warns(caplog):
    registry = Registry()
    text = describe_version("m", "3", dataset_fingerprint="abc", np=2, client=registry)
    assert registry.descriptions == {("m", "3"): text}
    assert "- engine: horovod" in text  # the default engine
    assert registry.tags == {
        ("m", "3"): {
            "hvdflow.dataset_fingerprint": "abc",
            "hvdflow.np": "2",
            "hvdflow.engine": "horovod",
        }
    }

    caplog.set_level(logging.WARNING, "hvdflow.tasks.train.model_card")
    assert describe_version("m", "3", dataset_fingerprint="a", np=2, client=Registry(True)) is None
    assert "could not describe m version 3 in MLflow: RESOURCE_DOES_NOT_EXIST" in caplog.text
    assert describe_version("m", None, dataset_fingerprint="a", np=2, client=registry) is None


@pytest.mark.unit
def test_the_version_tags_are_the_cards_facts_as_strings_without_a_login():
    tags = version_tags(
        dataset_fingerprint="f" * 64,
        np=-2,
        engine="tf_collective",
        dataset="s3://u:p@bucket/datasets/abc/attempt-1",
        origin=RunOrigin("prefect", "fr-1", "Prefect flow run"),
        run_id="r-1",
        val_accuracy=0.97531234,
        code_version="0.1.0",
        steady_images_per_s=12.5,  # the card's only: not a tag
    )
    assert tags == {
        "hvdflow.dataset_fingerprint": "f" * 64,
        "hvdflow.dataset": "s3://bucket/datasets/abc/attempt-1",
        "hvdflow.np": "-2",
        "hvdflow.engine": "tf_collective",
        "hvdflow.flow_run_id": "fr-1",
        "hvdflow.orchestrator": "prefect",
        "hvdflow.run_id": "r-1",
        "hvdflow.val_accuracy": "0.975312",
        "hvdflow.code_version": "0.1.0",
    }


@pytest.mark.unit
def test_an_airflow_dag_run_is_named_as_such_on_the_card_and_in_the_tags():
    run = "hvdflow_pipeline/manual__2026-11-27T21:36:32+00:00"
    url = "http://127.0.0.1:8080/dags/hvdflow_pipeline/runs/manual__2026-11-27T21:36:32+00:00"
    origin = RunOrigin("airflow", run, "Airflow DAG run", url)
    card = version_card(dataset_fingerprint="f" * 64, np=2, origin=origin)
    assert f"- Airflow DAG run: [{run}]({url})" in card
    assert "Prefect" not in card
    assert f"- Airflow DAG run: `{run}`" in version_card(
        dataset_fingerprint="f" * 64, np=2, origin=RunOrigin("airflow", run, "Airflow DAG run")
    )
    tags = version_tags(dataset_fingerprint="f" * 64, np=2, origin=origin)
    assert tags["hvdflow.orchestrator"] == "airflow"
    assert tags["hvdflow.flow_run_id"] == run
