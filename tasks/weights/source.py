"""What a weights source is, before anything is staged: the offline source, and a source as
every record shows it. Loads nothing of the object store: the parameters check with it."""

from __future__ import annotations

from hvdflow.infra.secrets import redact_url

# Builds the model offline with random weights: a weights file of the right shape where the
# public weights cannot be downloaded.
OFFLINE_SOURCE = "keras:weights=None"


def redact(source: str) -> str:
    """The source without user:password or query string (presigned URLs carry tokens there)."""
    return redact_url(source)
