import logging

import pytest
from pydantic import ValidationError

from hvdflow.infra.launcher.options import HorovodOptions

pytestmark = pytest.mark.unit


def test_defaults_leave_horovods_own_defaults():
    assert HorovodOptions().to_env() == {}


def test_every_knob_maps_to_its_variable():
    options = HorovodOptions(
        timeline_path="/tmp/t.json",
        timeline_mark_cycles=True,
        autotune=True,
        autotune_log="/tmp/a.csv",
        fusion_threshold_bytes=33554432,
        cycle_time_ms=3.5,
        gloo_timeout_s=60,
        extra_env={"NCCL_DEBUG": "INFO"},
    )
    assert options.to_env() == {
        "HOROVOD_TIMELINE": "/tmp/t.json",
        "HOROVOD_TIMELINE_MARK_CYCLES": "1",
        "HOROVOD_AUTOTUNE": "1",
        "HOROVOD_AUTOTUNE_LOG": "/tmp/a.csv",
        "HOROVOD_FUSION_THRESHOLD": "33554432",
        "HOROVOD_CYCLE_TIME": "3.5",
        "HOROVOD_GLOO_TIMEOUT_SECONDS": "60",
        "NCCL_DEBUG": "INFO",
    }


def test_options_are_frozen_and_checked():
    options = HorovodOptions()
    with pytest.raises(ValidationError):
        options.autotune = True
    with pytest.raises(ValidationError, match="fusion_threshold_bytes"):
        HorovodOptions(fusion_threshold_bytes=-1)
    with pytest.raises(ValidationError, match="timeline"):
        HorovodOptions(timeline="/tmp/x")  # misspelt knob: rejected, not ignored


def test_timeline_warns_about_its_cost(caplog):
    with caplog.at_level(logging.WARNING):
        HorovodOptions(timeline_path="/tmp/t.json").warn_about_costs()
    assert "slows training" in caplog.text and "40%" in caplog.text


@pytest.mark.unit
def test_the_engine_table_has_one_row_for_each_engine_named_once():
    from hvdflow.infra import constants as c
    from hvdflow.infra.launcher import _engines

    assert tuple(_engines.ENGINES) == c.ENGINES
    with pytest.raises(
        ValueError, match="engine='mpi': expected one of horovod, tf_collective, torch"
    ):
        _engines.engine("mpi")
