"""Retries on the pipeline's flaky edges: the object store and the tracking server.

Only these retry inside a flow run. A training's own retries are the launcher's
(``launcher.retries``, from the last checkpoint); anything else would fail the same way again.
"""

EDGE_RETRIES = 3
EDGE_RETRY_DELAYS_S = [2, 5, 10]
