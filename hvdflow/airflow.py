"""hvdflow for Airflow: the pipeline and registry-driven scoring as DAGs.

    from hvdflow.airflow import pipeline_dag, scoring_dag

    pipeline_dag()   # hvdflow_pipeline: validate, check tracking, preprocess, stage weights,
                     # train, register; triggered from the UI's form or on a schedule
    scoring_dag()    # hvdflow_score: runs on each new champion, with that version

Import it in Airflow's environment, where hvdflow may be installed without its dependencies
(``pip install --no-deps hvdflow``): the tasks run in hvdflow's own environment
(``HVDFLOW_PYTHON``). ``python -m hvdflow.airflow`` prints an example DAG file.
"""

from __future__ import annotations

import sys
from importlib.resources import files

from hvdflow.flows.airflow.dags import (
    champion_asset,
    hvdflow_python,
    pipeline_dag,
    scoring_dag,
)

__all__ = ["champion_asset", "hvdflow_python", "pipeline_dag", "scoring_dag"]


def example_dag_file() -> str:
    """The text of the example DAG file (``hvdflow/flows/airflow/example_dags.py``)."""
    return files("hvdflow.flows.airflow").joinpath("example_dags.py").read_text()


if __name__ == "__main__":
    sys.stdout.write(example_dag_file())
