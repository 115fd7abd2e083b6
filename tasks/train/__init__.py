"""Steps 3 and 4 of the pipeline: train with HorovodRunner, track in MLflow, publish.

``config`` (``TrainConfig``, light enough for the command line), ``run`` (one training as one
MLflow run), ``attempts`` (retries after a transient failure), ``resume`` (which run and
checkpoint a training continues), ``registry`` (the aliases, settled race-free), ``model_card``,
``progress``, ``origin`` (the orchestrator's run) and ``tags``.
"""
