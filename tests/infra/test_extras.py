"""A feature whose optional extra is missing fails at once, in one line that says what to
install. Horovod, Petastorm and tensorflow-addons are absent for real in the current profile;
where one is installed (the classic profile), its case skips. TensorFlow is absent for real in
the thin client's environment."""

from __future__ import annotations

import subprocess

import pytest

from hvdflow import HorovodRunner
from hvdflow.flows.params import BenchParams
from hvdflow.infra import extras
from hvdflow.tasks.config import LauncherParams, TrainingParams
from tests.uv import CHECKOUT

pytestmark = pytest.mark.unit


def absent(extra: extras.Extra) -> None:
    if extras.installed(extra):
        pytest.skip(f"{extra.module} is installed here (the classic profile)")


def test_the_horovod_engine_without_horovod_fails_before_any_task_saying_what_to_install():
    absent(extras.HOROVOD)
    with pytest.raises(extras.MissingExtra) as raised:
        HorovodRunner(np=2).run(print)  # np=2 on no Spark: it fails before Spark is asked
    message = str(raised.value)
    assert "\n" not in message
    assert message.startswith("HorovodRunner np=2 with engine='horovod' needs horovod")
    assert "pip install 'hvdflow[horovod]'" in message and "engine='tf_collective'" in message
    with pytest.raises(extras.MissingExtra, match=r"launcher.engine='horovod' needs horovod"):
        LauncherParams(engine="horovod")
    assert LauncherParams().engine == "tf_collective"
    with pytest.raises(extras.MissingExtra, match=r"condition 'hvd2' needs horovod"):
        BenchParams(conditions=["keras", "hvd2"])
    assert BenchParams().conditions == ["keras", "keras1", "ceiling2", "tf1", "tf2"]


def test_petastorms_reader_without_petastorm_fails_saying_what_to_install():
    absent(extras.PETASTORM)
    with pytest.raises(extras.MissingExtra, match=r"pip install 'hvdflow\[petastorm\]'"):
        TrainingParams(reader="petastorm")
    assert TrainingParams().reader == "pyarrow"


def test_radam_without_tensorflow_addons_fails_saying_what_to_install():
    absent(extras.ADDONS)
    with pytest.raises(extras.MissingExtra, match=r"pip install 'hvdflow\[addons\]'"):
        TrainingParams(optimizer="radam")


def test_tensorflows_engine_where_tensorflow_is_not_installed_fails_saying_what_to_install():
    # The thin client's environment (scripts/setup.sh client) has hvdflow and no TensorFlow.
    thin = CHECKOUT / ".venv-client" / "bin" / "python"
    if not thin.exists():
        pytest.skip("no thin client's environment here: scripts/setup.sh client")
    run = subprocess.run(
        [str(thin), "-c", "from hvdflow import HorovodRunner, LaunchOptions\n"
         "HorovodRunner(np=-1, options=LaunchOptions(engine='tf_collective')).run(print)"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    last = run.stderr.strip().splitlines()[-1]
    assert last.startswith("hvdflow.infra.extras.MissingExtra: HorovodRunner np=-1 with engine=")
    assert "needs tensorflow, which is not installed" in last
    assert "pip install 'hvdflow[tensorflow]'" in last and "TorchDistributor" in last
