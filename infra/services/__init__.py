"""The embedded services behind ``hvdflow up``: SeaweedFS (S3), MLflow and Prefect servers.

Each is one ``Service`` subclass with the same shape (``start()`` waits until it answers,
``stop()`` stops its process group); ``local.LocalServices`` starts, finds and stops them for one
``HVDFLOW_HOME``. ``free_port`` and ``stop_process_group`` are here for tests and scripts that
need a port or must stop a service by its pid.
"""

from infra.services._process import free_port, stop_process_group

__all__ = ["free_port", "stop_process_group"]
