"""What a registry consumer does with a champion, checked against ``hvdflow score``: the model's
own requirements in a fresh environment without hvdflow, ``mlflow models serve`` answering image
files POSTed as base64, and ``hvdflow.score_udf`` on a DataFrame of image bytes the consumer
built (joined with their own metadata). Whichever framework trained the champion."""

from __future__ import annotations

import os

import numpy as np
import pyarrow.parquet as pq

from hvdflow.flows.params import ScoreParams
from tests.helpers import terminate

# The requirements that name a framework: exactly those that trained the model, nothing else.
FRAMEWORKS = ("tensorflow", "tf-keras", "torch")


def check_consumer_routes(model: str, version, heldout, good, trained_with, spark, tmp_path):
    """Serve and UDF-score ``model``'s ``version`` on the files of ``heldout`` (``good`` are the
    readable ones), and compare with ``hvdflow score``'s predictions. ``trained_with``: the
    framework requirements the model must name, in order."""
    import base64
    import json
    import subprocess
    import time
    import urllib.request

    import mlflow.artifacts

    from hvdflow.flows.prefect.scoring import score
    from hvdflow.infra.ports import unclaimed_port
    from tests.model_env import model_env

    model_dir = mlflow.artifacts.download_artifacts(
        artifact_uri=f"models:/{model}/{version}", dst_path=str(tmp_path / "model")
    )
    requirements = (tmp_path / "model" / "requirements.txt").read_text().split()
    assert [r for r in requirements if r.startswith(FRAMEWORKS)] == trained_with
    env_dir = model_env(tmp_path / "model" / "requirements.txt")
    python = str(env_dir / "bin" / "python")
    assert subprocess.run([python, "-c", "import hvdflow"], capture_output=True).returncode == 1

    port = unclaimed_port("127.0.0.1")
    clean_env = {k: v for k, v in os.environ.items() if not k.startswith(("MLFLOW_", "HVDFLOW_"))}
    server = subprocess.Popen(
        [str(env_dir / "bin" / "mlflow"), "models", "serve", "-m", model_dir, "-p", str(port)]
        + ["--host", "127.0.0.1", "--env-manager", "local"],
        env={**clean_env, "PATH": f"{env_dir / 'bin'}:{os.environ['PATH']}"},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 180
        while True:
            assert server.poll() is None, server.stdout.read()[-3000:]
            try:
                with urllib.request.urlopen(f"{url}/ping", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            assert time.monotonic() < deadline, "mlflow models serve never answered /ping"
            time.sleep(1)
        files = [*good, "notes.txt"]  # one that is no image: answered with why, not failed
        body = {
            "dataframe_split": {
                "columns": ["image"],
                "data": [[base64.b64encode((heldout / f).read_bytes()).decode()] for f in files],
            }
        }
        request = urllib.request.Request(
            f"{url}/invocations",
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=120) as r:
            served = json.loads(r.read())["predictions"]
    finally:
        terminate(server)

    summary = score(ScoreParams(model={"name": model}, data={"input": str(heldout)}))
    table = pq.read_table(summary["predictions"]).sort_by("source").to_pylist()
    assert [row["source"] for row in table] == good
    assert [p["class_name"] for p in served[:-1]] == [row["class_name"] for row in table]
    assert [p["class_index"] for p in served[:-1]] == [row["class_index"] for row in table]
    np.testing.assert_allclose(
        [p["probability"] for p in served[:-1]], [row["probability"] for row in table], rtol=1e-5
    )
    assert served[-1]["class_name"] is None and served[-1]["error"]

    # The UDF on the user's own DataFrame: bytes joined with metadata, a path, a bad file.
    from hvdflow import score_udf

    images = spark.createDataFrame(
        [(f, (heldout / f).read_bytes()) for f in files], "source string, content binary"
    )
    owners = spark.createDataFrame(
        [(f, f"owner-{i % 3}") for i, f in enumerate(files)], "source string, owner string"
    )
    predict = score_udf(f"models:/{model}@champion")
    scored = (
        images.join(owners, "source")
        .withColumn("prediction", predict("content"))
        .select("source", "owner", "prediction.*")
        .orderBy("source")
        .collect()
    )
    by_source = {row["source"]: row for row in scored}
    assert sorted(by_source) == sorted(files)
    assert [by_source[f]["class_index"] for f in good] == [r["class_index"] for r in table]
    assert [by_source[f]["class_name"] for f in good] == [r["class_name"] for r in table]
    np.testing.assert_allclose(
        [by_source[f]["probability"] for f in good], [r["probability"] for r in table], rtol=1e-5
    )
    assert by_source["notes.txt"]["class_name"] is None and by_source["notes.txt"]["error"]
    # Paths work as well as bytes.
    paths = spark.createDataFrame([(str(heldout / good[0]),)], "path string")
    first = paths.select(predict("path").alias("p")).collect()[0]["p"]
    assert (first["class_index"], first["error"]) == (table[0]["class_index"], None)
