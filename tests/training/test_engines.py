"""The engines' defaults that are decided in the rank (``hvdflow.training.engines``)."""

import os

import pytest

from hvdflow.infra.constants import HOROVOD_CYCLE_TIME
from hvdflow.training.engines import CPU_CYCLE_TIME_MS, _cycle_time_for_cpu_ranks


@pytest.mark.unit
def test_a_cpu_rank_negotiates_every_10_ms_while_horovod_starts(monkeypatch):
    monkeypatch.delenv(HOROVOD_CYCLE_TIME, raising=False)
    with _cycle_time_for_cpu_ranks():
        assert os.environ[HOROVOD_CYCLE_TIME] == str(CPU_CYCLE_TIME_MS) == "10"
    assert HOROVOD_CYCLE_TIME not in os.environ  # the process's environment as it was


@pytest.mark.unit
def test_a_cycle_time_the_user_set_wins(monkeypatch):
    monkeypatch.setenv(HOROVOD_CYCLE_TIME, "3")
    with _cycle_time_for_cpu_ranks():
        assert os.environ[HOROVOD_CYCLE_TIME] == "3"
    assert os.environ[HOROVOD_CYCLE_TIME] == "3"
