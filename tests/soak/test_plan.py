"""The soak's seeded plan over both profiles, and a profile's part read back from its record."""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

import pytest

from tests.soak import phases, report
from tests.soak.plan import (
    AIRFLOW,
    CLASSIC,
    CURRENT,
    FACE_OF_KIND,
    FAULT_KINDS,
    OPT_IN,
    make_plan,
)
from tests.soak.runner import IdleCheck, RunRecord

pytestmark = pytest.mark.unit


def test_a_plan_over_both_profiles_puts_one_copy_of_every_kind_in_each():
    plan = make_plan(30, 9, epochs=4, each=2, airflow=8, torch=5, burst=10, current=15)
    assert [p.index for p in plan] == list(range(len(plan)))
    faults = Counter((p.profile, p.fault) for p in plan if p.fault)
    assert faults == Counter(
        {(profile, k): 1 for profile in (CLASSIC, CURRENT) for k in FAULT_KINDS if k not in OPT_IN}
    )
    # Each profile's stack starts empty: its first run is the clean one that builds the dataset.
    for profile in (CLASSIC, CURRENT):
        first = next(p for p in plan if p.profile == profile)
        assert first.fault is None and not first.overlap, first
        # It stages the weights that a weights_altered fault alters: a PyTorch run stages none.
        assert first.framework == "tensorflow", first
    # The classic profile's runs and bursts come first; PyTorch and the bursts stay there.
    profiles = [p.profile for p in plan]
    assert profiles == [CLASSIC] * (15 + 2 * 10) + [CURRENT] * 15
    assert {p.profile for p in plan if p.framework == "torch" or p.burst} == {CLASSIC}
    assert sum(p.framework == "torch" for p in plan) == 5
    # Runs whose fault strikes Airflow go through it in either profile; the total is kept.
    assert all(p.face == AIRFLOW for p in plan if FACE_OF_KIND.get(p.fault) == AIRFLOW)
    assert sum(p.face == AIRFLOW for p in plan if not p.burst) == 8


def test_a_plan_without_current_runs_is_the_classic_one_it_always_was():
    """A seed replays the schedule of the records in docs/benchmarks (the CI soak's too)."""
    plan = make_plan(
        2, 2, ["s3_restart", "prefect_restart"], epochs=4, each=1, clean_first=False, airflow=1
    )
    assert [(p.face, p.fault, p.profile) for p in plan] == [
        ("prefect", "prefect_restart", CLASSIC),
        ("airflow", "s3_restart", CLASSIC),
    ]
    bursts = make_plan(3, 1, ["rank_kill"], epochs=4, each=1, burst=2, burst_faces=("prefect",))
    assert [(p.face, p.burst) for p in bursts[3:]] == [("prefect", True)] * 2


def test_a_profile_too_small_for_its_share_of_kinds_says_how_many_runs_it_needs():
    with pytest.raises(
        ValueError, match=r"5 runs in the current profile .* give --runs 23 .*--current 8"
    ):
        make_plan(20, 1, epochs=4, each=1, current=5, airflow=2)


def test_a_part_read_back_from_its_record_is_the_part_written(tmp_path):
    (planned,) = make_plan(1, 3, ["rank_kill"], epochs=4, each=1, clean_first=False)
    record = RunRecord(planned, "flow-run", {"began": 1.5}, {"state": "COMPLETED"}, {"versions": 1})
    idle = IdleCheck(0, [], [], {"root_tmp_new": [], "worker_folders": {"w": "live"}})
    part = phases.Part(CURRENT, [record], [idle], {"state": "COMPLETED", "problems": []})
    phases.write_part(part, tmp_path / "part.json")
    again = phases.read_part(tmp_path / "part.json")
    assert again == part and not again.bad()
    phases.write_plan([planned], tmp_path / "plan.json")
    assert phases.read_plan(tmp_path / "plan.json") == [planned]


def test_the_runs_through_spark_connect_are_the_current_profiles_last_one_at_a_time():
    plain = make_plan(30, 9, epochs=4, each=2, airflow=8, torch=5, burst=10, current=15)
    plan = make_plan(30, 9, epochs=4, each=2, airflow=8, torch=5, burst=10, current=15, connect=6)
    through = [p for p in plan if p.connect]
    prefect = [p.index for p in plan if p.profile == CURRENT and p.face == "prefect"]
    assert [p.index for p in through] == prefect[-6:]
    assert any(p.face == AIRFLOW for p in plan[through[0].index :]), "none interleaved: no test"
    # The server runs only for its runs: none of them, and no run after one, overlaps another.
    after = [plan[p.index + 1] for p in through if p.index + 1 < len(plan)]
    assert not any(p.overlap for p in through + after)
    # Otherwise the plan is the one without them: the same faults, faces and moments.
    assert [replace(p, connect=False, overlap=False) for p in plan] == [
        replace(p, overlap=False) for p in plain
    ]
    with pytest.raises(ValueError, match=r"connect=3: give between 0 and --current \(2\)"):
        make_plan(4, 1, ["rank_kill"], epochs=4, each=1, current=2, connect=3)
    with pytest.raises(ValueError, match=r"connect=2: the current profile has 1 runs through"):
        make_plan(2, 1, ["rank_kill"], epochs=4, each=0, current=2, airflow=1, connect=2)


def test_a_fault_that_found_nothing_to_strike_is_not_counted_as_injected():
    """A rank_kill on hosts that run no rank (none here: a cluster of no hosts) finds nothing:
    its run is not counted as one the fault struck (the mixed soak of 2026-11-30 counted a
    weights_altered that found no staged weights)."""
    from types import SimpleNamespace

    from tests.soak.checks import Ledger
    from tests.soak.runner import Soak

    missed, hit = make_plan(3, 5, ["rank_kill"], epochs=4, each=2)[1:]
    soak = object.__new__(Soak)  # its strike alone: no stack, worker or log to start
    soak.stack = SimpleNamespace(cluster=SimpleNamespace(netns_inodes={}))
    soak.say, soak.harness_errors, soak.ledger, soak.damage = print, [], Ledger(), []
    strike = soak.strike(missed)
    assert strike == {"struck": "not struck: no rank was running"} and not soak.harness_errors
    records = [
        RunRecord(missed, "a", strike, {"state": "COMPLETED"}),
        RunRecord(hit, "b", {"struck": "rank pid 7 SIGKILLed", "began": 1.0}, {"state": "X"}),
    ]
    row = next(ln for ln in report.table(records, []).splitlines() if "rank_kill" in ln)
    assert "| 1 of 2 runs |" in row, row


def test_each_run_trains_from_a_seed_of_its_own():
    """So that a later run can beat the champion and move it (an Airflow run's register then
    triggers the scoring DAG, which the soak checks)."""
    from tests.soak.runner import run_params

    plan = make_plan(4, 2, ["rank_kill"], epochs=4, each=1)
    seeds = [run_params(p, {}, 4)["training"]["seed"] for p in plan]
    assert len(set(seeds)) == len(plan)


def test_the_container_kill_runs_only_when_asked_for_in_the_classic_profile_alone():
    assert "container_kill" in OPT_IN
    default = make_plan(30, 9, epochs=4, airflow=8, current=15)
    assert all(p.fault != "container_kill" for p in default)
    plan = make_plan(8, 3, ["container_kill", "rank_kill"], epochs=4, current=3)
    kills = [p for p in plan if p.fault == "container_kill"]
    assert len(kills) == 2 and {p.profile for p in kills} == {CLASSIC}
    # The container's worker serves its run alone: no run overlaps it, nor it the one before.
    for p in kills:
        assert not p.overlap and not (p.index + 1 < len(plan) and plan[p.index + 1].overlap)
