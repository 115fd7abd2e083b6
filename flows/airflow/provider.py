"""What ``airflow providers list`` says of hvdflow (the ``apache_airflow_provider`` entry point).

Loaded by Airflow's provider manager in Airflow's environment: standard library only.
"""

from __future__ import annotations

from importlib.metadata import version


def get_provider_info() -> dict:
    return {
        "package-name": "hvdflow",
        "name": "hvdflow",
        "description": "Spark-to-deep-learning pipelines: preprocessing on Spark, distributed "
        "training (Horovod, TensorFlow, PyTorch), MLflow tracking and registry-driven scoring. "
        "DAG factories: hvdflow.airflow.pipeline_dag, hvdflow.airflow.scoring_dag.",
        "versions": [version("hvdflow")],
    }
