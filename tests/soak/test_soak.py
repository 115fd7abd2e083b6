"""The short soak CI runs: two runs of the pipeline on the multi-host harness, each with a fault,
from a fixed seed, checked like the long one (``python -m tests.soak``): the first through the
Prefect deployment, the second through Airflow's pipeline DAG (Airflow starts meanwhile). No
clean run comes first (the long soak has one): the first run builds the dataset and stages the
weights under its fault, and the second finds them.

After the runs, one scoring run with the champion they left, through the scoring deployment.

The kinds are those whose first soak found defects: the Prefect server restarted under a training
(the slots it held stayed taken for ever) and SeaweedFS restarted under one (it came back on
another port; the rank that met the outage failed the run for good)."""

from __future__ import annotations

import pytest

from tests.soak import report
from tests.soak.plan import make_plan
from tests.soak.session import run_soak
from tests.soak.stack import RUNNER_STORAGE

pytestmark = pytest.mark.slow

SEED = 2  # prefect_restart through Prefect first, then s3_restart through Airflow
KINDS = ["s3_restart", "prefect_restart"]
EPOCHS = 4  # the faults strike in epoch 2


@pytest.mark.timeout(1200)
def test_a_short_soak_loses_nothing_and_leaves_nothing_behind(netns_cluster, tmp_path):
    plan = make_plan(len(KINDS), SEED, KINDS, epochs=EPOCHS, each=1, clean_first=False, airflow=1)
    assert [(p.face, p.fault) for p in plan] == [("prefect", KINDS[1]), ("airflow", KINDS[0])]
    soak = run_soak(netns_cluster, tmp_path, plan, EPOCHS)
    summary = report.summary(soak.records, soak.idle)
    print(report.table(soak.records, soak.idle))
    assert summary["problems"] == [], summary
    assert summary["leftover_processes"] == [] and soak.final_leftovers == [], summary
    assert summary["failed_without_reason"] == 0, summary
    assert soak.harness_errors == []
    # The worker's runner folder was told apart from what the runs left, and went with it.
    ((folder, how),) = soak.stack.worker_folders.items()
    assert how == "stopped" and not (RUNNER_STORAGE.parent / folder).exists(), folder
    # Every fault struck while its run trained, and the runs went on to a registered model.
    for record in soak.records:
        if record.planned.fault:
            assert "began" in record.strike, record.strike
    assert summary["completed"] >= 2, summary
    # The Airflow run's model is the registry's like any other: one version, its epochs once.
    (through_airflow,) = [r for r in soak.records if r.planned.face == "airflow"]
    assert through_airflow.outcome["state"] == "COMPLETED", through_airflow.outcome
    assert through_airflow.mlflow["versions"] == 1, through_airflow.mlflow
    assert through_airflow.outcome["epochs_begun"] >= EPOCHS, through_airflow.outcome
    assert soak.idle and soak.idle[-1].figures.get("champion"), soak.idle[-1]
    # Then scoring with the champion the runs left, through its own deployment.
    assert soak.scoring["state"] == "COMPLETED" and soak.scoring["problems"] == [], soak.scoring
