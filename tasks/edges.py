"""Retries on the pipeline's flaky edges, the object store and the tracking server; the only
ones in a flow run (a training's own are ``launcher.retries``, from the last checkpoint)."""

EDGE_RETRIES = 3
EDGE_RETRY_DELAYS_S = [2, 5, 10]
