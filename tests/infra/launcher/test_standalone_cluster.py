"""HorovodRunner on a real Spark standalone cluster: a master and two one-core workers.

The driver runs in its own process (one SparkContext per process), configured the way a user
would: HVDFLOW_SPARK_MASTER and a spark-defaults.conf in SPARK_CONF_DIR.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.helpers import wait_for_no_ranks
from tests.standalone_cluster import standalone_cluster

pytestmark = pytest.mark.slow


def test_np2_on_two_one_core_workers_ends_with_identical_weights(tmp_path):
    conf_dir = tmp_path / "conf"
    conf_dir.mkdir()
    (conf_dir / "spark-defaults.conf").write_text(
        "spark.executor.cores 1\nspark.cores.max 2\nspark.executor.memory 1g\n"
        "spark.ui.enabled false\n"
    )
    with standalone_cluster(tmp_path) as master:
        env = {
            **os.environ,
            "HVDFLOW_SPARK_MASTER": master,
            "SPARK_CONF_DIR": str(conf_dir),
            "SPARK_LOCAL_IP": "127.0.0.1",
        }
        smoke = subprocess.run(
            [sys.executable, "-m", "hvdflow.flows.cli", "smoke", "--np", "2", "--epochs", "2"],
            capture_output=True,
            text=True,
            env=env,
            timeout=400,
        )
        assert smoke.returncode == 0, smoke.stderr[-4000:]
        result = json.loads(smoke.stdout[smoke.stdout.index("{") :])
        assert result["size"] == 2
        assert len(set(result["checksums"])) == 1 and len(result["checksums"]) == 2
        assert result["identical_weights"] is True
        # Both executors ran a rank: the tasks were spread over the two workers.
        executor_dirs = list(tmp_path.glob("work*/app-*/*"))
        assert len(executor_dirs) == 2, executor_dirs
        assert "[1,1]<stdout>" in smoke.stderr or "[1,1]<stderr>" in smoke.stderr
    assert wait_for_no_ranks() == []
