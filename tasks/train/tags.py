"""The MLflow tags hvdflow puts on a training run."""

# The orchestrator's run that trained it (``RunOrigin.run_id``): that run retried resumes it.
FLOW_RUN_TAG = "hvdflow.flow_run_id"
# Which orchestrator that run belongs to (``RunOrigin.orchestrator``).
ORCHESTRATOR_TAG = "hvdflow.orchestrator"
# The trainings started for the run, resumed ones included.
ATTEMPTS_TAG = "hvdflow.training_attempts"
# Why its model was not published (hvdflow.training.quality).
REJECTED_TAG = "hvdflow.rejected"
