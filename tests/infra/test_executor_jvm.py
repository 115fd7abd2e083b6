"""The executors' temporary folder on a standalone master: exact options, merged with the user's."""

from __future__ import annotations

import pytest

from hvdflow.infra.executor_jvm import EXECUTOR_TMPDIR_OPTION, executor_java_options, spark_defaults

KEY = "spark.executor.extraJavaOptions"
pytestmark = pytest.mark.unit


@pytest.fixture(autouse=True)
def _no_defaults(tmp_path, monkeypatch):
    """An empty SPARK_CONF_DIR unless a test writes spark-defaults.conf into it."""
    monkeypatch.setenv("SPARK_CONF_DIR", str(tmp_path))


def test_a_standalone_masters_executors_keep_their_temporary_files_in_their_work_folder():
    assert EXECUTOR_TMPDIR_OPTION == "-Djava.io.tmpdir=."
    assert executor_java_options("spark://10.0.0.1:7077") == {KEY: "-Djava.io.tmpdir=."}
    assert executor_java_options("spark://a:7077,b:7077") == {KEY: "-Djava.io.tmpdir=."}


@pytest.mark.parametrize("master", ["local[2]", "local-cluster[2,1,1024]", "yarn", "k8s://h:6443"])
def test_other_masters_are_left_as_they_are(master):
    # YARN puts a container's tmpdir in its folder itself; local executors are the driver's JVM.
    assert executor_java_options(master) == {}


def test_the_users_own_options_are_kept(tmp_path):
    given = {KEY: "-XX:+UseG1GC -Dfoo=bar"}
    assert executor_java_options("spark://m:7077", given) == {
        KEY: "-XX:+UseG1GC -Dfoo=bar -Djava.io.tmpdir=."
    }
    (tmp_path / "spark-defaults.conf").write_text(
        "# the cluster's defaults\nspark.executor.memory 2g\n"
        "spark.executor.extraJavaOptions   -Xss4m\n"
    )
    assert executor_java_options("spark://m:7077") == {KEY: "-Xss4m -Djava.io.tmpdir=."}
    # What the session's own conf says wins over spark-defaults.conf, as in Spark.
    assert executor_java_options("spark://m:7077", given)[KEY].startswith("-XX:+UseG1GC")


def test_a_temporary_folder_the_user_chose_is_not_overridden(tmp_path):
    assert executor_java_options("spark://m:7077", {KEY: "-Djava.io.tmpdir=/scratch"}) == {}
    (tmp_path / "spark-defaults.conf").write_text(f"{KEY}=-Djava.io.tmpdir=/scratch\n")
    assert executor_java_options("spark://m:7077") == {}


def test_spark_defaults_reads_every_separator_spark_submit_takes(tmp_path):
    (tmp_path / "spark-defaults.conf").write_text(
        "spark.a 1\nspark.b=2\nspark.c : 3\n  spark.d\t4 5  \n! a comment\n#spark.e 6\nspark.f\n"
    )
    assert spark_defaults() == {"spark.a": "1", "spark.b": "2", "spark.c": "3", "spark.d": "4 5"}


def test_no_defaults_file_means_no_defaults(tmp_path, monkeypatch):
    monkeypatch.setenv("SPARK_CONF_DIR", str(tmp_path / "absent"))
    assert spark_defaults() == {}
