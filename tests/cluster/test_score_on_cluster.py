"""Batch scoring on the multi-host harness: images in a bucket, predictions written back to it.

The services run on the driver's address with their credentials (``hvdflow up --bind``), the
raw digits (some objects bad) sit in the bucket, and a model is registered as champion in the
cluster's MLflow. A user's ``hvdflow score`` on the driver then scores on the executors of the
two worker hosts, each of which fetches the model from the driver once and writes its
predictions straight to the bucket.
"""

from __future__ import annotations

import csv
import io
import json
import re

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.cluster.driver import run_driver
from tests.cluster.fixtures import BAD
from tests.tasks.score.helpers import model_predictions, register_model

pytestmark = pytest.mark.slow

MODEL = "cluster-scoring"
INPUT = "s3://hvdflow/raw/digits/"


@pytest.mark.timeout(900)
def test_two_hosts_score_from_and_into_the_bucket(netns_cluster, cluster_services, tmp_path):
    from hvdflow.infra._env import temporary_env
    from hvdflow.infra.storage.object_store import ObjectStore, ObjectStoreConfig

    home, env, good = cluster_services
    with temporary_env(env):
        version = register_model(env["MLFLOW_TRACKING_URI"], MODEL)
    run = run_driver(
        netns_cluster,
        "-m",
        "hvdflow.flows.cli",
        "score",
        *("--model", MODEL, "--input", INPUT, "--output", "s3://hvdflow/scores/digits"),
        workdir=tmp_path / "driver",
        timeout_s=800,
        env={"HVDFLOW_HOME": str(home), "HVDFLOW_CACHE_DIR": str(tmp_path / "cache")},
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-5000:]
    assert f"model version    models:/{MODEL}/{version} (asked for models:/{MODEL}@champion)" in (
        run.stdout
    )
    scored = re.search(r"scored\s+(\d+) images \((\d+) quarantined\)", run.stdout)
    assert scored and (int(scored.group(1)), int(scored.group(2))) == (good, len(BAD))

    with temporary_env(env):
        store = ObjectStore(ObjectStoreConfig.from_env(bucket="hvdflow"))
        manifest = json.loads(store.get_bytes("s3://hvdflow/scores/digits/manifest.json"))
        prefix = manifest["predictions_url"].removeprefix("s3://hvdflow/")
        parts = [k for k in store.list_keys(prefix + "/") if k.endswith(".parquet")]
        table = pa.concat_tables(
            pq.read_table(io.BytesIO(store.get_bytes(f"s3://hvdflow/{key}"))) for key in parts
        ).sort_by("source")
        sources = table.column("source").to_pylist()
        images = [store.get_bytes(INPUT + source) for source in sources]
        classes, probabilities = model_predictions(
            f"models:/{MODEL}/{version}", images, (8, 8), "L"
        )
        report = store.get_bytes(manifest["quarantine_path"]).decode()

    # Every good object once, predicted as the model's own predict does; the bad ones quarantined.
    assert len(sources) == len(set(sources)) == good
    assert table.column("class_index").to_pylist() == classes.tolist()
    np.testing.assert_allclose(table.column("probability").to_numpy(), probabilities, rtol=1e-5)
    assert sorted(r["source"] for r in csv.DictReader(io.StringIO(report))) == sorted(BAD)
    # Both hosts scored; each executor process loaded the model once, without horovod.
    executors = manifest["executors"]
    assert {e["host"] for e in executors} == {h.name for h in netns_cluster.hosts}
    assert all(e["loads"] == 1 and not e["horovod"] for e in executors), executors
    assert manifest["model"]["version"] == version
