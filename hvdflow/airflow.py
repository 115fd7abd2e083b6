"""hvdflow for Airflow: the pipeline and registry-driven scoring as DAGs.

    from hvdflow.airflow import pipeline_dag, scoring_dag

    pipeline_dag()   # hvdflow_pipeline: validate, check tracking, preprocess, stage weights,
                     # train, register; triggered from the UI's form or on a schedule
    scoring_dag()    # hvdflow_score: runs on each new champion, with that version

Import it in Airflow's environment, where hvdflow may be installed without its dependencies
(``pip install --no-deps hvdflow``): the tasks run in hvdflow's own environment
(``HVDFLOW_PYTHON``). ``python -m hvdflow.airflow`` prints an example DAG file, in either
environment (the factories, which import Airflow, load when first used).
"""

from __future__ import annotations

import argparse
import sys
from importlib.resources import files
from typing import TYPE_CHECKING

from hvdflow.infra._lazy import lazy_exports

if TYPE_CHECKING:  # what the lazy exports are, for type checkers and editors (never run)
    from hvdflow.flows.airflow.dags import champion_asset as champion_asset
    from hvdflow.flows.airflow.dags import hvdflow_python as hvdflow_python
    from hvdflow.flows.airflow.dags import pipeline_dag as pipeline_dag
    from hvdflow.flows.airflow.dags import scoring_dag as scoring_dag

_DAGS = "hvdflow.flows.airflow.dags"
_EXPORTS = dict.fromkeys(("champion_asset", "hvdflow_python", "pipeline_dag", "scoring_dag"), _DAGS)
__all__ = sorted(_EXPORTS)
__getattr__ = lazy_exports(__name__, _EXPORTS)


def example_dag_file() -> str:
    """The text of the example DAG file (``hvdflow/flows/airflow/example_dags.py``)."""
    return files("hvdflow.flows.airflow").joinpath("example_dags.py").read_text()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m hvdflow.airflow",
        description="Print hvdflow's example DAG file (the pipeline and the champion's "
        "scoring), for Airflow's dags folder: "
        'python -m hvdflow.airflow > "$AIRFLOW_HOME/dags/hvdflow_dags.py"',
    )
    parser.parse_args(argv)
    sys.stdout.write(example_dag_file())
    return 0


if __name__ == "__main__":
    sys.exit(main())
