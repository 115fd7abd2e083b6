"""hvdflow's pipeline as Airflow DAGs, in two halves that live in two environments.

- ``dags``: the DAG factories, for Airflow's environment; they import Airflow and nothing of
  hvdflow's dependencies, so hvdflow can be installed there without them (``--no-deps``).
- ``steps``: what each task does, run by ``@task.external_python`` in hvdflow's own environment
  (``HVDFLOW_PYTHON``), with Spark, TensorFlow or PyTorch, MLflow and the object store.
- ``form``: the trigger form's fields, which both halves read.
- ``benchmark``: the same pipeline run through Prefect and through Airflow, timed side by side.

The public names are ``hvdflow.airflow``'s.
"""
