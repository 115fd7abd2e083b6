"""Executors on other hosts run a packed environment shipped with spark.archives.

This is how docs/clusters.md tells users to get hvdflow's environment onto a cluster whose executors
lack it: pack the virtual environment with venv-pack, ship it with ``spark.archives`` and point
``PYSPARK_PYTHON`` at the unpacked interpreter. The test packs a small environment holding one
module found nowhere else, so a host can only import it from the archive Spark unpacked on its
own private disk.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from tests.cluster.driver import run_driver

pytestmark = pytest.mark.slow

MARKER = "hvdflow_packed_marker"

DRIVER = textwrap.dedent(
    f"""
    import json, sys
    from hvdflow.infra.spark import get_spark

    spark = get_spark(conf={{"spark.archives": sys.argv[1] + "#environment"}})

    def where(_):
        import os, socket, sys
        import {MARKER}
        return socket.gethostname(), sys.executable, os.getcwd(), {MARKER}.VALUE

    found = spark.sparkContext.parallelize(range(2), 2).map(where).collect()
    print("FOUND " + json.dumps(found))
    spark.stop()
    """
)


@pytest.mark.timeout(600)
def test_executors_run_the_packed_environment_from_their_own_disk(netns_cluster, tmp_path):
    import venv_pack

    env_dir = tmp_path / "packed-env"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(env_dir)], check=True)
    site = next(env_dir.glob("lib/python3*/site-packages"))
    (site / f"{MARKER}.py").write_text("VALUE = 'from the archive'\n")
    archive = tmp_path / "packed-env.tar.gz"
    venv_pack.pack(prefix=str(env_dir), output=str(archive))

    run = run_driver(
        netns_cluster,
        "-c",
        DRIVER,
        str(archive),
        workdir=tmp_path / "driver",
        timeout_s=420,
        env={"PYSPARK_PYTHON": "./environment/bin/python"},
    )
    assert run.returncode == 0, run.stderr[-4000:]
    line = next(ln for ln in run.stdout.splitlines() if ln.startswith("FOUND "))
    found = json.loads(line.removeprefix("FOUND "))
    assert sorted(host for host, *_ in found) == sorted(h.name for h in netns_cluster.hosts)
    for _host, executable, cwd, value in found:
        assert value == "from the archive"
        # The interpreter Spark unpacked into the executor's work dir, on the host's own /tmp.
        assert executable == f"{cwd}/environment/bin/python"
        assert cwd.startswith("/tmp/")
