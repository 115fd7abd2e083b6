"""hvdflow's pipeline and its champion's scoring, as Airflow DAGs.

Copy this file into Airflow's dags folder (``python -m hvdflow.airflow > dags/hvdflow_dags.py``).
Where Airflow parses DAGs and runs tasks, set:

- ``HVDFLOW_PYTHON``: the Python of hvdflow's environment, which runs the tasks;
- ``MLFLOW_TRACKING_URI``: the tracking server (and ``MLFLOW_TRACKING_USERNAME``/``PASSWORD``);
- ``AWS_ENDPOINT_URL``, ``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``: the object store;
- ``HVDFLOW_SPARK_MASTER``: the Spark master (unset: local[N] on the worker);
- ``HVDFLOW_SCORE_INPUT``: the images each new champion scores;
- ``HVDFLOW_SCORE_OUTPUT``: where their predictions go (on a cluster: ``s3://bucket/prefix``).

Trigger ``hvdflow_pipeline`` from the UI (its form takes np, epochs, model, ... and any other
parameter as nested JSON); ``hvdflow_score`` runs by itself when training moves ``champion``.
"""

from hvdflow.airflow import pipeline_dag, scoring_dag

pipeline_dag()
scoring_dag()
