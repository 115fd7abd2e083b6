"""Secret references and URL redaction: exact values, no server."""

from __future__ import annotations

import os

import pytest

from hvdflow.infra.secrets import (
    check_reference,
    is_reference,
    redact_url,
    resolve,
    split_userinfo,
    tracking_login,
)

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        (
            "http://alice:hunter2@127.0.0.1:8080/w.h5?X-Amz-Signature=abc&X-Amz-Security-Token=t#f",
            "http://127.0.0.1:8080/w.h5?<redacted>",
        ),
        ("https://bob@Weights.Example.com/v1/w.h5", "https://weights.example.com/v1/w.h5"),
        ("http://u:p@[::1]:5000/api", "http://[::1]:5000/api"),
        ("postgresql://mlflow:pw@db:5432/mlflow", "postgresql://db:5432/mlflow"),
        ("s3://bucket/w.h5?versionId=3", "s3://bucket/w.h5?<redacted>"),
        ("http://127.0.0.1:5000", "http://127.0.0.1:5000"),
        # Not URLs with a host: shown as they are.
        ("/data/w.h5", "/data/w.h5"),
        ("env:WEIGHTS_URL", "env:WEIGHTS_URL"),
        ("secret:weights-url", "secret:weights-url"),
        ("file:./mlruns", "file:./mlruns"),
        ("keras:weights=None", "keras:weights=None"),
        ("", ""),
    ],
)
def test_a_url_is_shown_without_login_query_or_fragment(url, shown):
    assert redact_url(url) == shown


def test_userinfo_is_split_off_and_decoded():
    assert split_userinfo("http://al%40ice:p%3Ass@host:1/p?q=1") == (
        "http://host:1/p?q=1",
        "al@ice",
        "p:ss",
    )
    assert split_userinfo("http://token@host/p") == ("http://host/p", "token", None)
    assert split_userinfo("http://host:5000") == ("http://host:5000", None, None)
    assert split_userinfo("/a/path") == ("/a/path", None, None)


def test_references_are_told_from_literals():
    assert is_reference("env:X") and is_reference("secret:x")
    assert not is_reference("https://host/w.h5") and not is_reference("ENV:X")


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (
            "env:1BAD",
            "weights_source 'env:1BAD': an environment variable name follows 'env:' (letters, "
            "digits and '_', not starting with a digit), e.g. 'env:WEIGHTS_URL'",
        ),
        (
            "env:",
            "weights_source 'env:': an environment variable name follows 'env:' (letters, "
            "digits and '_', not starting with a digit), e.g. 'env:WEIGHTS_URL'",
        ),
        (
            "secret:Weights_URL",
            "weights_source 'secret:Weights_URL': a Prefect Secret block name follows 'secret:' "
            "(lower-case letters, digits and '-'), e.g. 'secret:weights-url'",
        ),
    ],
)
def test_a_malformed_reference_is_refused_naming_it_and_the_form(value, message):
    with pytest.raises(ValueError) as err:
        check_reference(value, "weights_source")
    assert str(err.value) == message


def test_an_env_reference_resolves_to_the_variable_and_a_literal_to_itself(monkeypatch):
    monkeypatch.setenv("HVDFLOW_TEST_URL", "https://u:pw@host/w.h5")
    assert resolve("env:HVDFLOW_TEST_URL") == "https://u:pw@host/w.h5"
    assert resolve("https://host/w.h5") == "https://host/w.h5"
    assert check_reference("https://host/w.h5", "x") == "https://host/w.h5"


def test_an_unset_variable_names_the_reference_and_the_fix(monkeypatch):
    monkeypatch.delenv("HVDFLOW_TEST_UNSET", raising=False)
    with pytest.raises(RuntimeError) as err:
        resolve("env:HVDFLOW_TEST_UNSET", "training.weights_source")
    assert str(err.value) == (
        "training.weights_source 'env:HVDFLOW_TEST_UNSET' refers to the environment variable "
        "HVDFLOW_TEST_UNSET, which is not set on the driver: export it where the flow runs, or "
        "pass another reference"
    )


LOGIN = ("MLFLOW_TRACKING_URI", "MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD")


def test_the_tracking_login_moves_to_mlflows_variables_for_a_while(monkeypatch):
    for name in LOGIN:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://ann:s%3Acret@127.0.0.1:5000")
    with tracking_login(os.environ["MLFLOW_TRACKING_URI"]) as uri:
        assert uri == "http://127.0.0.1:5000"
        assert {name: os.environ.get(name) for name in LOGIN} == {
            "MLFLOW_TRACKING_URI": "http://127.0.0.1:5000",
            "MLFLOW_TRACKING_USERNAME": "ann",
            "MLFLOW_TRACKING_PASSWORD": "s:cret",
        }
    assert {name: os.environ.get(name) for name in LOGIN} == {
        "MLFLOW_TRACKING_URI": "http://ann:s%3Acret@127.0.0.1:5000",
        "MLFLOW_TRACKING_USERNAME": None,
        "MLFLOW_TRACKING_PASSWORD": None,
    }


def test_a_login_already_in_mlflows_variables_wins_as_in_mlflow(monkeypatch):
    monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", "svc")
    monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", "from-env")
    with tracking_login("http://ann:pw@127.0.0.1:5000") as uri:
        assert uri == "http://127.0.0.1:5000"
        assert os.environ["MLFLOW_TRACKING_USERNAME"] == "svc"
        assert os.environ["MLFLOW_TRACKING_PASSWORD"] == "from-env"


def test_a_uri_without_login_changes_nothing(monkeypatch):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    with tracking_login("file:./mlruns") as uri:
        assert uri == "file:./mlruns" and "MLFLOW_TRACKING_URI" not in os.environ
