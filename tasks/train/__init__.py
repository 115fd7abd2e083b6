"""Steps 3 and 4 of the pipeline: train with HorovodRunner, track in MLflow, publish.

- ``config``: the step's parameters (``TrainConfig``), light enough for the command line
- ``run``: one training tracked as one MLflow run (parameters, metrics, artifacts, the guard)
- ``attempts``: the training function on HorovodRunner, run again after a transient failure
- ``resume``: which MLflow run and checkpoint a training continues, and what it must match
- ``registry``: the registry's aliases (``candidate``, ``champion``), settled race-free
- ``model_card``: what the registered version says about itself
- ``progress``: how far a training is, from its epoch lines
- ``origin``: the orchestrator's run that trains, as the records name it
- ``tags``: the MLflow tags a training run carries
"""
