"""Batch scoring with a registered model on Spark: the registry's consumer.

``config``, ``model`` (the registry's version, checked against the data), ``inputs``, ``job``
(the driver), ``executor`` and ``model_cache`` (the executors), ``publish`` (the output's atomic
layout) and ``record`` (MLflow); the images themselves are ``hvdflow.tasks.images``'.
"""
