"""The whole pipeline on the multi-host harness, with its data in a bucket.

Raw images (some of them bad) sit in the embedded S3 bound to the driver's address with keys
enforced; MLflow and Prefect run beside it with their logins (``hvdflow up --bind``). A user's
``hvdflow run`` on the driver preprocesses on the two worker hosts straight from and into the
bucket, trains np=2 with one rank per host and registers the model. A second job then reads the
training split the way ranks do, one rank per host, to show the shards are disjoint and cover
every row.
"""

from __future__ import annotations

import csv
import io
import json
import re
import textwrap

import pytest

from tests.cluster.driver import run_driver
from tests.cluster.fixtures import BAD
from tests.helpers import wait_for_no_ranks

pytestmark = pytest.mark.slow

READ_SHARDS = textwrap.dedent(
    """
    import json, sys
    from hvdflow import HorovodRunner

    def read(train_url):
        import socket
        import horovod.tensorflow as hvd
        from hvdflow.training.reader import open_dataset

        hvd.init()
        with open_dataset(
            train_url, rank=hvd.rank(), size=hvd.size(), batch_size=None, num_epochs=1,
            shuffle=False, fields=("source",), normalize=False,
        ) as rows:
            mine = sorted(row.source.numpy().decode() for row in rows)
        return hvd.allgather_object({"host": socket.gethostname(), "sources": mine})

    print("SHARDS " + json.dumps(HorovodRunner(np=2).run(read, train_url=sys.argv[1])))
    """
)


@pytest.mark.timeout(1500)
def test_the_pipeline_runs_on_two_hosts_from_and_into_the_bucket(
    netns_cluster, cluster_services, tmp_path
):
    from mlflow import MlflowClient

    from hvdflow.infra._env import temporary_env
    from hvdflow.infra.storage.object_store import ObjectStore, ObjectStoreConfig

    home, env, good = cluster_services
    run = run_driver(
        netns_cluster,
        "-m",
        "hvdflow.flows.cli",
        "run",
        *("--np", "2", "--epochs", "1", "--input-format", "folders"),
        *("--input", "s3://hvdflow/raw/digits/", "--output", "s3://hvdflow/datasets"),
        workdir=tmp_path / "driver",
        timeout_s=1200,
        env={"HVDFLOW_HOME": str(home)},
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-5000:]
    dataset = re.search(r"dataset\s+(s3://\S+) \((\d+) quarantined\)", run.stdout)
    assert dataset, run.stdout[-3000:]
    assert int(dataset.group(2)) == len(BAD)
    version = re.search(r"model version\s+models:/hvdflow-classifier/(\d+)", run.stdout)
    assert version, run.stdout[-3000:]
    # The flow ran on the cluster's Prefect server, not on a temporary one of its own.
    assert f"Prefect UI       http://{netns_cluster.driver_ip}:" in run.stdout
    assert "temporary server" not in run.stderr

    with temporary_env(env):
        store = ObjectStore(ObjectStoreConfig.from_env(bucket="hvdflow"))
        # The quarantine report sits in the bucket, one row per bad object, with its reason.
        report = store.get_bytes(f"{dataset.group(1)}/quarantine.csv").decode()
        rows = list(csv.DictReader(io.StringIO(report)))
        assert sorted(r["source"] for r in rows) == sorted(BAD)
        # The model is registered, behind the MLflow login the services require.
        registered = MlflowClient(env["MLFLOW_TRACKING_URI"]).get_model_version_by_alias(
            "hvdflow-classifier", "candidate"
        )
        assert registered.version == version.group(1)
        manifest = json.loads(
            store.get_bytes(dataset.group(1).rsplit("/", 1)[0] + "/manifest.json")
        )
    assert manifest["train_rows"] + manifest["val_rows"] == good

    # Every rank reads its own shard of the training split, one rank per host.
    shards = run_driver(
        netns_cluster,
        "-c",
        READ_SHARDS,
        manifest["train_url"],
        workdir=tmp_path / "reader",
        timeout_s=600,
        env={k: env[k] for k in env if k.startswith("AWS_")},
    )
    assert shards.returncode == 0, shards.stderr[-5000:]
    line = next(ln for ln in shards.stdout.splitlines() if ln.startswith("SHARDS "))
    per_rank = json.loads(line.removeprefix("SHARDS "))
    assert sorted(r["host"] for r in per_rank) == sorted(h.name for h in netns_cluster.hosts)
    first, second = (set(r["sources"]) for r in per_rank)
    assert first and second and not first & second
    assert len(first | second) == manifest["train_rows"]
    assert wait_for_no_ranks(30) == []


@pytest.mark.timeout(900)
def test_a_preprocessing_retried_after_an_executor_died_mid_write_has_every_row_once(
    netns_cluster, cluster_services, tmp_path
):
    from hvdflow.tasks.preprocess.write import CRASH_AFTER_FIRST_FILE_ENV

    _home, env, good = cluster_services
    aws = {k: env[k] for k in env if k.startswith("AWS_")}
    output = "s3://hvdflow/retried"
    # First attempt: the executor writing partition 1 dies (os._exit) after its first file.
    crashed = run_driver(
        netns_cluster,
        "-c",
        PREPROCESS_ONCE,
        output,
        json.dumps({f"spark.executorEnv.{CRASH_AFTER_FIRST_FILE_ENV}": "1"}),
        workdir=tmp_path / "crashed",
        timeout_s=600,
        env=aws,
    )
    assert crashed.returncode != 0 and "PREPROCESSED" not in crashed.stdout
    retried = run_driver(
        netns_cluster,
        "-c",
        PREPROCESS_ONCE,
        output,
        "{}",
        workdir=tmp_path / "retried",
        timeout_s=600,
        env=aws,
    )
    assert retried.returncode == 0, retried.stderr[-5000:]
    line = next(ln for ln in retried.stdout.splitlines() if ln.startswith("PREPROCESSED "))
    result = json.loads(line.removeprefix("PREPROCESSED "))
    assert result["rows"] == good and sorted(result["read"]) == sorted(set(result["read"]))
    assert len(result["read"]) == good  # every row exactly once, none of the crashed attempt


# argv: output prefix, extra Spark conf as JSON. Preprocesses the bucket's raw images, then
# reads both splits back the way ranks do.
PREPROCESS_ONCE = textwrap.dedent(
    """
    import json, sys
    from hvdflow.infra.spark import get_spark
    from hvdflow.tasks.preprocess import PreprocessConfig, preprocess_images
    from hvdflow.training.reader import open_dataset

    spark = get_spark(conf=json.loads(sys.argv[2]))
    config = PreprocessConfig(
        input="s3://hvdflow/raw/digits/", input_format="folders", output=sys.argv[1],
        image_size=(8, 8),
    )
    manifest = preprocess_images(spark, config)
    read = []
    for url in (manifest.train_url, manifest.val_url):
        with open_dataset(url, batch_size=None, num_epochs=1, shuffle=False,
                          fields=("source",), normalize=False) as rows:
            read += [row.source.numpy().decode() for row in rows]
    rows = manifest.train_rows + manifest.val_rows
    print("PREPROCESSED " + json.dumps({"rows": rows, "read": read}))
    spark.stop()
    """
)
