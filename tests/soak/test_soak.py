"""The short soak CI runs: two runs of the deployed pipeline on the multi-host harness, each with
a fault, from a fixed seed, checked like the long one (``python -m tests.soak``). No clean run
comes first (the long soak has one): the first run builds the dataset and stages the weights
under its fault, and the second finds them.

After the runs, one scoring run with the champion they left, through the scoring deployment.

The kinds are those whose first soak found defects: SeaweedFS restarted under a training (it came
back on another port; the rank that met the outage failed the run for good) and the Prefect
server restarted under one (the slots it held stayed taken for ever)."""

from __future__ import annotations

import pytest

from tests.soak import report
from tests.soak.plan import make_plan
from tests.soak.session import run_soak

pytestmark = pytest.mark.slow

SEED = 7
KINDS = ["s3_restart", "prefect_restart"]
EPOCHS = 4  # the faults strike in epoch 2


@pytest.mark.timeout(1200)
def test_a_short_soak_loses_nothing_and_leaves_nothing_behind(netns_cluster, tmp_path):
    plan = make_plan(len(KINDS), SEED, KINDS, epochs=EPOCHS, each=1, clean_first=False)
    soak = run_soak(netns_cluster, tmp_path, plan, EPOCHS)
    summary = report.summary(soak.records, soak.idle)
    print(report.table(soak.records, soak.idle))
    assert summary["problems"] == [], summary
    assert summary["leftover_processes"] == [] and soak.final_leftovers == [], summary
    assert summary["failed_without_reason"] == 0, summary
    assert soak.harness_errors == []
    # Every fault struck while its run trained, and the runs went on to a registered model.
    for record in soak.records:
        if record.planned.fault:
            assert "began" in record.strike, record.strike
    assert summary["completed"] >= 2, summary
    assert soak.idle and soak.idle[-1].figures.get("champion"), soak.idle[-1]
    # Then scoring with the champion the runs left, through its own deployment.
    assert soak.scoring["state"] == "COMPLETED" and soak.scoring["problems"] == [], soak.scoring
