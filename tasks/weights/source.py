"""What a weights source is, before anything is staged: the offline source, and a source as
every record shows it.

The parameters check a ``weights_source`` with these when they are built, at the flow's entry:
importing this module loads nothing of the object store (staging does, stage.py).
"""

from __future__ import annotations

from hvdflow.infra.secrets import redact_url

# A source that builds the model offline with random weights (``weights=None``): a real weights
# file of the right shape where the public weights cannot be downloaded.
OFFLINE_SOURCE = "keras:weights=None"


def redact(source: str) -> str:
    """The source as every record shows it: no user:password, no query string (presigned URLs
    carry tokens there). ``hvdflow.infra.secrets.redact_url``."""
    return redact_url(source)
