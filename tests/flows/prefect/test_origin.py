"""The Prefect flow run as a training's origin: its page under Prefect's UI."""

from __future__ import annotations

import pytest

from hvdflow.flows.prefect.origin import flow_run_url, this_flow_run


@pytest.mark.unit
def test_the_flow_run_link_is_under_the_prefect_ui():
    from prefect.settings import PREFECT_API_URL, PREFECT_UI_URL, temporary_settings

    with temporary_settings({PREFECT_API_URL: "http://127.0.0.1:4200/api"}):
        assert flow_run_url("f-1") == "http://127.0.0.1:4200/runs/flow-run/f-1"
    with temporary_settings({PREFECT_UI_URL: "https://prefect.example.org"}):
        assert flow_run_url("f-1") == "https://prefect.example.org/runs/flow-run/f-1"
    assert flow_run_url(None) is None


@pytest.mark.unit
def test_outside_a_flow_run_there_is_no_origin():
    assert this_flow_run() is None
