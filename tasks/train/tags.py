"""The MLflow tags hvdflow puts on a training run."""

# The MLflow run's tag naming the Prefect flow run that trained it: a retried flow run resumes it.
FLOW_RUN_TAG = "hvdflow.flow_run_id"
# The MLflow run's tag counting the trainings started for it, resumed ones included.
ATTEMPTS_TAG = "hvdflow.training_attempts"
# The MLflow run's tag saying why its model was not published (hvdflow.training.quality).
REJECTED_TAG = "hvdflow.rejected"
