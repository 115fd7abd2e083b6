"""The registry's aliases on a real MLflow server over HTTP, with runs that finish together."""

from __future__ import annotations

import json
import threading
import urllib.error
import urllib.request
import uuid
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from mlflow import MlflowClient
from mlflow.exceptions import MlflowException

from hvdflow.tasks.train.registry import (
    CANDIDATE,
    CHAMPION,
    CHAMPION_METRIC,
    CONTENDER_TAG,
    assign_aliases,
    best,
    newest,
)


def new_model(client: MlflowClient) -> tuple[str, str]:
    """A registered model and an experiment of the test's own: (model name, experiment id)."""
    name = f"tests-registry-{uuid.uuid4().hex[:8]}"
    client.create_registered_model(name)
    return name, client.create_experiment(name)


def register(client: MlflowClient, name: str, experiment_id: str, accuracy: float) -> str:
    """A finished run with ``accuracy`` as its final val_accuracy, registered as a new version."""
    run_id = client.create_run(experiment_id).info.run_id
    client.log_metric(run_id, CHAMPION_METRIC, accuracy)
    client.set_terminated(run_id)
    return client.create_model_version(name, f"runs:/{run_id}/model", run_id=run_id).version


def holder(client: MlflowClient, name: str, alias: str) -> str:
    return client.get_model_version_by_alias(name, alias).version


def race(uri: str, name: str, experiment_id: str, accuracies: list[float]) -> dict:
    """One thread per accuracy registers a version, then all assign their aliases at once;
    version -> (accuracy, the aliases its call returned)."""
    start = threading.Barrier(len(accuracies))
    results: dict[str, tuple[float, list[str]]] = {}
    errors: list[BaseException] = []

    def run(accuracy: float) -> None:
        try:
            client = MlflowClient(uri)
            version = register(client, name, experiment_id, accuracy)
            start.wait(timeout=60)
            results[version] = (accuracy, assign_aliases(name, version, client=client))
        except BaseException as e:  # raised again in the test's thread
            errors.append(e)

    threads = [threading.Thread(target=run, args=(a,)) for a in accuracies]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    if errors:
        raise errors[0]
    assert len(results) == len(accuracies)
    return results


@pytest.mark.integration
def test_runs_that_finish_together_leave_the_champion_on_the_best(mlflow_server):
    client = MlflowClient(mlflow_server.tracking_uri)
    name, experiment_id = new_model(client)
    # Each round: three runs register and assign their aliases at the same moment. The third
    # round's runs are all worse than the champion of the second.
    rounds = [
        [0.60, 0.70, 0.65],
        [0.72, 0.75, 0.71],
        [0.50, 0.55, 0.52],
        [0.80, 0.79, 0.78],
        [0.81, 0.82, 0.83],
    ]
    scores: dict[str, float] = {}
    for accuracies in rounds:
        results = race(mlflow_server.tracking_uri, name, experiment_id, accuracies)
        scores.update({version: accuracy for version, (accuracy, _) in results.items()})

        best_so_far = max(scores, key=scores.get)
        assert holder(client, name, CHAMPION) == best_so_far, (accuracies, scores)
        assert holder(client, name, CANDIDATE) == max(scores, key=int)
        for version, (_accuracy, aliases) in results.items():
            # The round's best saw itself win; no other call claims the champion.
            assert (CHAMPION in aliases) == (version == best_so_far), (version, aliases)


@pytest.mark.integration
def test_a_model_without_a_champion_gets_one_and_a_worse_version_only_the_candidate(
    mlflow_server,
):
    client = MlflowClient(mlflow_server.tracking_uri)
    name, experiment_id = new_model(client)
    first = register(client, name, experiment_id, 0.7)
    assert assign_aliases(name, first, client=client) == [CANDIDATE, CHAMPION]
    assert holder(client, name, CHAMPION) == first
    assert client.get_model_version(name, first).tags[CONTENDER_TAG] == "0.7"

    worse = register(client, name, experiment_id, 0.6)
    assert assign_aliases(name, worse, client=client) == [CANDIDATE]
    tie = register(client, name, experiment_id, 0.7)
    assert assign_aliases(name, tie, client=client) == [CANDIDATE]  # strictly higher only
    assert (holder(client, name, CHAMPION), holder(client, name, CANDIDATE)) == (first, tie)
    assert assign_aliases(name, None, client=client) == []


@pytest.mark.integration
def test_a_champion_set_by_hand_is_compared_by_its_runs_metric(mlflow_server):
    client = MlflowClient(mlflow_server.tracking_uri)
    name, experiment_id = new_model(client)
    by_hand = register(client, name, experiment_id, 0.9)  # never entered the contest
    client.set_registered_model_alias(name, CHAMPION, by_hand)
    newer = register(client, name, experiment_id, 0.8)
    assert assign_aliases(name, newer, client=client) == [CANDIDATE]
    assert holder(client, name, CHAMPION) == by_hand


@pytest.mark.integration
def test_a_failed_read_of_the_champion_propagates_and_moves_nothing(mlflow_server, monkeypatch):
    client = MlflowClient(mlflow_server.tracking_uri)
    name, experiment_id = new_model(client)
    champion = register(client, name, experiment_id, 0.9)
    assign_aliases(name, champion, client=client)
    worse = register(client, name, experiment_id, 0.5)

    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")  # the 500 at once, not in minutes
    with failing_champion_reads(mlflow_server.tracking_uri) as uri:
        with pytest.raises(MlflowException) as err:
            assign_aliases(name, worse, client=MlflowClient(uri))
    assert "alias=champion" in str(err.value) and "500 error" in str(err.value)
    assert holder(client, name, CHAMPION) == champion  # not taken as "no champion yet"


@pytest.mark.integration
def test_an_unknown_registered_model_fails_naming_it(mlflow_server):
    client = MlflowClient(mlflow_server.tracking_uri)
    name = f"tests-registry-missing-{uuid.uuid4().hex[:8]}"
    with pytest.raises(MlflowException, match=name):
        assign_aliases(name, "1", client=client)


@pytest.mark.unit
def test_the_champion_goes_to_the_best_score_and_stays_on_a_tie():
    assert best({}, None) is None
    assert best({"3": 0.5}, None) == "3"
    assert best({"3": 0.5, "4": 0.7, "5": 0.6}, ("2", 0.65)) == "4"
    assert best({"3": 0.5, "4": 0.7}, ("2", 0.7)) == "2"  # the holder keeps it on a tie
    assert best({"4": 0.7, "9": 0.7, "10": 0.7}, ("2", 0.1)) == "4"  # else the oldest wins
    assert best({"3": float("-inf")}, None) == "3"


@pytest.mark.unit
def test_the_candidate_goes_to_the_newest_version():
    assert newest({}, None) is None
    assert newest({"9": 0.1, "10": 0.2}, "3") == "10"  # by number, not as text
    assert newest({"4": 0.1}, "7") == "7"


@contextmanager
def failing_champion_reads(target: str):
    """A proxy to the tracking server at ``target`` that answers every read of the champion
    alias as a server whose sqlite database is locked does (500 INTERNAL_ERROR); yields its
    URI. Everything else goes through."""

    class Proxy(BaseHTTPRequestHandler):
        def forward(self):
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length) if length else None
            reads_champion = (
                "/registered-models/alias" in self.path and "alias=champion" in self.path
            )
            if self.command == "GET" and reads_champion:
                error = {"error_code": "INTERNAL_ERROR", "message": "database is locked"}
                return self.answer(500, json.dumps(error).encode())
            request = urllib.request.Request(
                target + self.path,
                data=body,
                method=self.command,
                headers={"Content-Type": self.headers.get("Content-Type", "application/json")},
            )
            try:
                with urllib.request.urlopen(request, timeout=30) as response:
                    self.answer(response.status, response.read())
            except urllib.error.HTTPError as e:
                self.answer(e.code, e.read())

        do_GET = do_POST = do_PATCH = do_DELETE = forward

        def answer(self, status: int, body: bytes):
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Proxy)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
