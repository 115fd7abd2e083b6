"""Where runs are tracked: the user's MLFLOW_TRACKING_URI, checked before any training starts."""

from __future__ import annotations

import os
import time
import urllib.error
import urllib.request

from hvdflow.infra.secrets import redact_url, split_userinfo

CHECK_TIMEOUT_S = 5.0
# How long a finished training waits for a tracking server that went down before it logs its
# results (rank 0 at the end of training, the driver before it registers the model).
TRACKER_WAIT_S = 300.0
# The registered model's aliases, for the registry's consumers: training moves them
# (``tasks.train.registry``), scoring and serving follow ``champion``.
CANDIDATE, CHAMPION = "candidate", "champion"


def tracking_uri(default: str | None = None) -> str:
    """``$MLFLOW_TRACKING_URI`` if set, else ``default``, else MLflow's local ./mlruns."""
    return os.environ.get("MLFLOW_TRACKING_URI") or default or "file:./mlruns"


def check_reachable(uri: str) -> None:
    """Fail fast, naming the URI, when an HTTP tracking server does not answer."""
    if not uri.startswith(("http://", "https://")):
        return
    bare, _user, _password = split_userinfo(uri)  # /health answers without a login
    try:
        with urllib.request.urlopen(f"{bare.rstrip('/')}/health", timeout=CHECK_TIMEOUT_S):
            return
    except urllib.error.HTTPError:
        return  # it answered: a server without /health (or behind auth) is still up
    except OSError as e:
        reason = getattr(e, "reason", e)
        raise RuntimeError(
            f"MLflow tracking server at {redact_url(uri)} is unreachable ({reason}): start it with "
            "`hvdflow up`, or set MLFLOW_TRACKING_URI to a running server. Nothing was trained."
        ) from None


def wait_until_reachable(uri: str, timeout_s: float, on_wait=None, poll_s: float = 2.0) -> None:
    """Return once the tracking server at ``uri`` answers; RuntimeError after ``timeout_s``.

    ``on_wait(message)`` is called once, if the server does not answer at first: end-of-run
    logging waits out a tracking server's restart instead of failing a finished training.
    """
    deadline = time.monotonic() + timeout_s
    told = False
    while True:
        try:
            check_reachable(uri)
            return
        except RuntimeError as e:
            if time.monotonic() >= deadline:
                raise RuntimeError(f"{e} (waited {timeout_s:g} s for it)") from None
            if not told and on_wait is not None:
                on_wait(
                    f"MLflow tracking server at {redact_url(uri)} is not answering: waiting up "
                    f"to {timeout_s:g} s for it before logging the results"
                )
                told = True
            time.sleep(poll_s)
