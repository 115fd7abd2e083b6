"""The embedded services behind ``hvdflow up``: SeaweedFS (S3), MLflow and Prefect servers.

Each is one ``Service`` subclass with the same shape (``start()`` waits until it answers,
``stop()`` stops its process group); ``local.LocalServices`` starts, finds and stops them for one
``HVDFLOW_HOME``. ``free_port`` and ``stop_process_group`` are here for tests and scripts that
need a port or must stop a service by its pid; ``check_bind_address`` and ``is_loopback`` for
what decides where the services listen and whether they require credentials.
"""

from hvdflow.infra.services._process import (
    check_bind_address,
    free_port,
    is_loopback,
    stop_process_group,
)

__all__ = ["check_bind_address", "free_port", "is_loopback", "stop_process_group"]
