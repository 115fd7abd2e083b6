"""The Airflow-against-Prefect study's table: medians, what is left beside the training, and
the time between Airflow's tasks."""

from __future__ import annotations

import pytest


@pytest.mark.unit
def test_the_table_shows_medians_the_orchestrations_share_and_the_gaps_between_tasks():
    from studies.airflow_vs_prefect import table

    runs = {
        "prefect": [{"wall_s": 30.0, "training_s": 20.0}, {"wall_s": 34.0, "training_s": 22.0}],
        "airflow": [
            {"wall_s": 40.0, "training_s": 21.0, "tasks_s": 35.0},
            {"wall_s": 44.0, "training_s": 21.0, "tasks_s": 37.0},
        ],
    }
    text = table(runs)
    assert "| wall clock, call to end (median, s) | 32.0 | 42.0 | 1.31x |" in text
    assert "| training (median, s) | 21.0 | 21.0 | 1.00x |" in text
    assert "| the rest: orchestration, steps (s) | 11.0 | 21.0 | 1.91x |" in text
    assert "| Airflow: between tasks (s) |  | 6.0 | |" in text

    runs["prefect_process"] = [{"wall_s": 40.0, "training_s": 20.0}]
    text = table(runs)
    assert text.splitlines()[0] == (
        "| | Prefect, this process | Prefect, a fresh process | Airflow DAG "
        "| Airflow / Prefect, this process | Airflow / Prefect, a fresh process |"
    )
    assert "| wall clock, call to end (median, s) | 32.0 | 40.0 | 42.0 | 1.31x | 1.05x |" in text
