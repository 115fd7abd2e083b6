"""Batch scoring with a registered model on Spark: the registry's consumer.

``config`` (what to score, which model), ``model`` (the version found in the registry, checked
against the data), ``inputs`` (listing), ``job`` (the Spark job on the driver), ``executor`` and
``model_cache`` (what runs in the executors), ``publish`` (the output's atomic layout) and
``record`` (MLflow). Listing, fetching and decoding the images, and their quarantine, are
``hvdflow.tasks.images``', as preprocessing's are.
"""
