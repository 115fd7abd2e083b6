"""No secret in any record: a pipeline and a benchmark run with secrets in every input, then a
search of everything they leave behind.

Secrets go in wherever a user might put one: a weights URL with user:password and a signed query
(passed as ``env:NAME`` and ``secret:block-name``), ``horovod.extra_env`` (both reference kinds),
the AWS keys, MLflow's MLFLOW_TRACKING_PASSWORD and a tracking URI with user:password. The search
covers MLflow (params, tags, artifacts, registry, its database), Prefect (flow-run, task-run and
deployment records, logs, artifacts, persisted results, its database), the driver logs, local
files, the bucket, the process's stdout and stderr and a failed run's exception.
"""

from __future__ import annotations

import base64
import json
import os
import secrets
import time
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

import pytest

from hvdflow.flows.prefect.benchmark import BenchParams, benchmark
from hvdflow.flows.prefect.pipeline import PipelineParams, pipeline
from tests.helpers import http_server, wait_for_no_ranks

# Larger files are not read back from the bucket: weights and Parquet, no text records.
MAX_OBJECT_BYTES = 20 * 1024 * 1024
# Keras reads a file named *.weights.h5 in its newer format: the staged copy keeps the suffix.
WEIGHTS_PATH = "/digits_mlp.weights.h5"


def occurrences(planted: Mapping[str, str], records: Iterable[tuple[str, bytes | str]]) -> list:
    """``"<secret> in <where>"`` for every planted secret found in a record's content."""
    found = []
    for where, content in records:
        data = content.encode("utf-8", "replace") if isinstance(content, str) else content
        for name, secret in planted.items():
            if secret.encode() in data:
                found.append(f"{name} in {where}")
    return found


@pytest.mark.unit
def test_the_search_names_each_secret_and_where_it_was_found():
    planted = {"password": "pw-123", "token": "tok-456"}
    records = [
        ("MLflow param x", "nothing"),
        ("driver log /tmp/d.log", b"...pw-123...tok-456"),
        ("Prefect log 3", "pw-123"),
    ]
    assert occurrences(planted, records) == [
        "password in driver log /tmp/d.log",
        "token in driver log /tmp/d.log",
        "password in Prefect log 3",
    ]


def basic(user: str, password: str) -> str:
    return base64.b64encode(f"{user}:{password}".encode()).decode()


@contextmanager
def weights_host(body: bytes, user: str, password: str, signature: str):
    """A host that serves ``body`` at /digits_mlp.weights.h5 only with that login and signature."""
    seen: list[tuple[str, bool]] = []

    def respond(request):
        authorized = request.headers.get("Authorization") == f"Basic {basic(user, password)}"
        signed = (
            request.path == f"/digits_mlp.weights.h5?X-Amz-Signature={signature}&X-Amz-Expires=60"
        )
        seen.append((request.path.split("?")[0], authorized and signed))
        return body if authorized and signed else None

    respond.refuse_with = 401
    with http_server(respond) as port:
        yield port, seen


def files_under(root: Path, since: float = 0.0, label: str = "") -> Iterator[tuple[str, bytes]]:
    for path in sorted(root.rglob("*")):
        try:
            if path.is_file() and path.stat().st_mtime >= since:
                yield f"{label}file {path}", path.read_bytes()
        except OSError:  # removed while walking
            continue


def mlflow_records(tracking_uri: str, experiments: list[str], model: str, workdir: Path):
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri)
    for name in experiments:
        experiment = client.get_experiment_by_name(name)
        yield f"MLflow experiment {name}", json.dumps(dict(experiment.tags))
        for run in client.search_runs([experiment.experiment_id]):
            where = f"MLflow run {run.info.run_id} ({name})"
            yield f"{where} name", run.info.run_name or ""
            for key, value in run.data.params.items():
                yield f"{where} param {key}", f"{key}={value}"
            for key, value in run.data.tags.items():
                yield f"{where} tag {key}", f"{key}={value}"
            yield f"{where} metric names", " ".join(run.data.metrics)
            local = workdir / run.info.run_id
            local.mkdir(parents=True)
            client.download_artifacts(run.info.run_id, "", str(local))
            yield from files_under(local, label=f"{where} artifact ")
    for version in client.search_model_versions(f"name='{model}'"):
        yield (
            f"MLflow model {model} v{version.version}",
            json.dumps({k: str(v) for k, v in dict(version).items()}),
        )


def prefect_records(flow_run_ids: list, deployment_id) -> Iterator[tuple[str, str]]:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import (
        ArtifactFilter,
        ArtifactFilterFlowRunId,
        FlowRunFilter,
        FlowRunFilterId,
        LogFilter,
        LogFilterFlowRunId,
    )

    with get_client(sync_client=True) as client:
        runs = client.read_flow_runs(
            flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=flow_run_ids))
        )
        assert len(runs) == len(flow_run_ids)
        for run in runs:
            yield f"Prefect flow run {run.name} parameters", json.dumps(run.parameters)
            yield f"Prefect flow run {run.name} record", run.model_dump_json()
        tasks = client.read_task_runs(
            flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=flow_run_ids))
        )
        for task in tasks:
            yield f"Prefect task run {task.name}", task.model_dump_json()
        offset, logs = 0, []
        while batch := client.read_logs(
            log_filter=LogFilter(flow_run_id=LogFilterFlowRunId(any_=flow_run_ids)),
            limit=200,
            offset=offset,
        ):
            logs += batch
            offset += len(batch)
        assert logs, "the runs left no Prefect logs to search"
        for log in logs:
            yield f"Prefect log ({log.name}) {log.message[:60]!r}", log.message
        artifacts = client.read_artifacts(
            artifact_filter=ArtifactFilter(flow_run_id=ArtifactFilterFlowRunId(any_=flow_run_ids))
        )
        for artifact in artifacts:
            yield f"Prefect artifact {artifact.key}", artifact.model_dump_json()
        deployment = client.read_deployment(deployment_id)
        yield f"Prefect deployment {deployment.name} parameters", json.dumps(deployment.parameters)


def bucket_records(since: float) -> Iterator[tuple[str, bytes | str]]:
    import boto3

    s3 = boto3.client("s3", endpoint_url=os.environ["AWS_ENDPOINT_URL"])
    for bucket in (b["Name"] for b in s3.list_buckets()["Buckets"]):
        for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket):
            for obj in page.get("Contents", []):
                if obj["LastModified"].timestamp() < since:
                    continue
                where = f"bucket object s3://{bucket}/{obj['Key']}"
                head = s3.head_object(Bucket=bucket, Key=obj["Key"])
                yield f"{where} (key and metadata)", f"{obj['Key']} {json.dumps(head['Metadata'])}"
                if obj["Size"] <= MAX_OBJECT_BYTES:
                    yield where, s3.get_object(Bucket=bucket, Key=obj["Key"])["Body"].read()


@pytest.mark.slow
def test_no_planted_secret_reaches_any_record(
    prefect_harness,
    prefect_server,
    spark,
    seaweed,
    mlflow_server,
    tmp_path,
    monkeypatch,
    capfd,
    caplog,
):
    from prefect.blocks.system import Secret
    from prefect.client.orchestration import get_client
    from prefect.settings import PREFECT_LOCAL_STORAGE_PATH

    from hvdflow.training.models import build_model

    started = time.time() - 1
    token = secrets.token_hex(8)
    weights_user, weights_password, signature = "wuser", f"wpw{token}", f"wsig{token}"
    uri_user, uri_password = "uriuser", f"uripw{token}"
    mlflow_user, mlflow_password = "mluser", f"mlpw{token}"
    planted = {
        "weights URL password": weights_password,
        "weights URL signature": signature,
        "weights URL login (base64)": basic(weights_user, weights_password),
        "a wrong weights URL password": f"wrongpw{token}",
        "extra_env value behind env:": f"rankenv{token}",
        "extra_env value behind secret:": f"rankblock{token}",
        "AWS secret access key": seaweed.credentials.secret_access_key,
        "AWS access key id": seaweed.credentials.access_key_id,
        "MLFLOW_TRACKING_PASSWORD": mlflow_password,
        "MLflow login (base64)": basic(mlflow_user, mlflow_password),
        "tracking URI password": uri_password,
        "tracking URI login (base64)": basic(uri_user, uri_password),
    }
    assert os.environ["AWS_SECRET_ACCESS_KEY"] == seaweed.credentials.secret_access_key
    canary = f"canary{token}"

    weights = tmp_path / "digits_mlp.weights.h5"
    build_model("digits_mlp", (8, 8, 1), 10).save_weights(str(weights))
    host = f"127.0.0.1:{mlflow_server.tracking_uri.rsplit(':', 1)[1]}"
    for name, value in {
        "HVDFLOW_HOME": str(tmp_path / "home"),
        "HVDFLOW_CACHE_DIR": str(tmp_path / "cache"),
        "HVDFLOW_PREFIX": tmp_path.name,
        "MLFLOW_TRACKING_URI": f"http://{uri_user}:{uri_password}@{host}",
        "HVDFLOW_SECURITY_RANK_TOKEN": f"rankenv{token}",
    }.items():
        monkeypatch.setenv(name, value)
    for name in ("MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD", "MLFLOW_TRACKING_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    data = {"input": str(tmp_path / "digits"), "output": str(tmp_path / "datasets")}

    with weights_host(weights.read_bytes(), weights_user, weights_password, signature) as (
        port,
        requests,
    ):
        query = f"X-Amz-Signature={signature}&X-Amz-Expires=60"
        url = f"http://{weights_user}:{weights_password}@127.0.0.1:{port}{WEIGHTS_PATH}?{query}"
        monkeypatch.setenv("HVDFLOW_SECURITY_WEIGHTS_URL", url)
        Secret(value=url).save("hvdflow-security-weights", overwrite=True)
        Secret(value=f"rankblock{token}").save("hvdflow-security-rank-token", overwrite=True)

        # 1. The pipeline: weights and extra_env behind env: references, the tracking URI's login.
        pipeline_params = PipelineParams(
            data=data,
            training={"epochs": 1, "weights_source": "env:HVDFLOW_SECURITY_WEIGHTS_URL"},
            launcher={
                "np": -1,
                "horovod": {
                    "extra_env": {
                        "HVDFLOW_RANK_TOKEN": "env:HVDFLOW_SECURITY_RANK_TOKEN",
                        # A literal is recorded as given: the control that the search finds one.
                        "HVDFLOW_CANARY": canary,
                    }
                },
            },
            tracking={"registered_model_name": "tests-security", "experiment": "tests-security"},
        )
        deployment_id = pipeline.to_deployment(
            name="hvdflow-security", parameters={"params": pipeline_params.model_dump(mode="json")}
        ).apply()
        # The same weights URL as a literal: Prefect's server refuses the run before storing
        # its parameters (the search below covers the server's database file).
        literal = pipeline_params.model_dump(mode="json")
        literal["training"]["weights_source"] = url
        with get_client(sync_client=True) as client, pytest.raises(Exception) as refused:
            client.create_flow_run_from_deployment(deployment_id, parameters={"params": literal})
        assert "weights_source" in str(refused.value), refused.value
        first = pipeline(pipeline_params, return_state=True)
        assert first.is_completed(), first
        summary = first.result()
        assert requests == [
            ("/digits_mlp.weights.h5", True)
        ]  # the reference reached the host, with its login

        # 2. The benchmark: the same behind secret: blocks, MLflow's login in its variables too.
        monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", mlflow_user)
        monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", mlflow_password)
        bench = benchmark(
            BenchParams(
                data={**data, "image_size": (8, 8)},
                training={
                    "model": "digits_mlp",
                    "epochs": 1,
                    "optimizer": "adam",
                    "learning_rate": 0.01,
                    "weights_source": "secret:hvdflow-security-weights",
                },
                launcher={
                    "horovod": {
                        "extra_env": {"HVDFLOW_RANK_TOKEN": "secret:hvdflow-security-rank-token"}
                    }
                },
                conditions=["keras", "1"],
                repetitions=1,
                experiment="tests-security-bench",
            ),
            return_state=True,
        )
        assert bench.is_completed(), bench

        # 3. A run that fails on a secret: the host refuses a wrong password.
        monkeypatch.setenv(
            "HVDFLOW_SECURITY_WEIGHTS_URL", url.replace(weights_password, f"wrongpw{token}")
        )
        failed = pipeline(pipeline_params, return_state=True)
        assert failed.is_failed()
    error = str(failed.result(raise_on_failure=False))
    shown = f"http://127.0.0.1:{port}{WEIGHTS_PATH}?<redacted>"
    assert f"could not download digits_mlp weights from {shown}: Unauthorized." in error
    assert wait_for_no_ranks() == []

    flow_run_ids = [s.state_details.flow_run_id for s in (first, bench, failed)]
    workdir = tmp_path / "records"  # goes with the test
    workdir.mkdir()
    database = prefect_server.database_path
    output = capfd.readouterr()
    records = [
        ("pipeline summary", json.dumps(summary)),
        ("failed run's exception", error),
        ("failed run's state message", failed.message or ""),
        ("stdout", output.out),
        ("stderr", output.err),
        ("Python log records", caplog.text),
        *mlflow_records(
            mlflow_server.tracking_uri,
            ["tests-security", "tests-security-bench"],
            "tests-security",
            workdir,
        ),
        *prefect_records(flow_run_ids, deployment_id),
        *files_under(database.parent, label="Prefect database "),
        *files_under(
            Path(PREFECT_LOCAL_STORAGE_PATH.value()), since=started, label="Prefect result "
        ),
        *files_under(Path(mlflow_server.home), label="MLflow server "),
        *files_under(tmp_path, label="local "),
        # Every HorovodRunner run's log, where the runner keeps it.
        *files_under(tmp_path / "home" / "logs" / "runs", label="driver-side "),
        *bucket_records(started),
    ]
    names = [where for where, _ in records]
    # The search reached what it claims to search.
    assert any(n.startswith("MLflow run") and " param np" in n for n in names)
    assert any(n.endswith("/logs/driver.log") for n in names if "artifact" in n)
    assert sum(n.startswith("Prefect flow run") and n.endswith("parameters") for n in names) == 3
    assert any(n.startswith("Prefect artifact hvdflow-summary") for n in names)
    assert any(n.startswith("Prefect deployment") for n in names)
    assert any(n.startswith("driver-side file") and n.endswith("driver.log") for n in names)
    assert any(n.startswith("bucket object") and "/weights/digits_mlp/" in n for n in names)
    assert (
        "env:HVDFLOW_SECURITY_WEIGHTS_URL"
        in dict(records)["Prefect deployment hvdflow-security parameters"]
    )

    # MLflow prints each run's link to stdout: it is searched, and shows no login.
    assert f"at: http://{host}/#/experiments/" in output.out
    # The literal canary is where a literal is documented to go, and the search finds it there.
    canary_at = occurrences({"canary": canary}, records)
    assert "canary in Prefect deployment hvdflow-security parameters" in canary_at
    assert sum(where.endswith(" parameters") for where in canary_at) == 3  # 2 runs, 1 deployment
    assert any(where.startswith("canary in Prefect database file") for where in canary_at)

    found = occurrences(planted, records)
    assert found == [], "secrets found in records:\n  " + "\n  ".join(found)
