"""The MLflow tags hvdflow puts on a training run."""

# The MLflow run's tag naming the orchestrator's run that trained it (``RunOrigin.run_id``): that
# run retried resumes it.
FLOW_RUN_TAG = "hvdflow.flow_run_id"
# Which orchestrator that run belongs to (``RunOrigin.orchestrator``).
ORCHESTRATOR_TAG = "hvdflow.orchestrator"
# The MLflow run's tag counting the trainings started for it, resumed ones included.
ATTEMPTS_TAG = "hvdflow.training_attempts"
# The MLflow run's tag saying why its model was not published (hvdflow.training.quality).
REJECTED_TAG = "hvdflow.rejected"
