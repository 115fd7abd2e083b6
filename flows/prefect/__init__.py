"""Prefect's face: the plain steps of ``hvdflow.tasks`` as Prefect tasks, and what only Prefect
has (result storage in the object store, the ``spark-slots`` concurrency limit, the
champion-moved event, the flow run as a training's origin).

The flows (``pipeline``, ``scoring``, ``benchmark``) compose these; ``deploy`` makes them
deployments of a work pool.
"""
