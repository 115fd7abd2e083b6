"""Rank 0's epoch metrics to MLflow, in order, without ever holding up training.

No TensorFlow here: the Keras callback (``training.callbacks.MlflowEpochMetrics``) and the torch
trainer (``training.torch_trainer``) both send through it.
"""

from __future__ import annotations

import collections
import threading
import time

from hvdflow.infra.launcher import log_to_driver
from hvdflow.infra.tracking import check_reachable


class EpochMetricsSender:
    """Sends epochs' metrics to MLflow from a thread of its own, keeping them while it cannot."""

    def __init__(self, run_id: str, retry_s: float = 5.0, client=None):
        self.run_id = run_id
        self.retry_s = retry_s
        self._client = client
        self._probe = client is None  # a real server: probe /health before each send
        self._pending: collections.deque = collections.deque()
        self._wake = threading.Condition()
        self._closing = False
        self.sent: list[int] = []  # epochs, in the order they went out
        self._thread = threading.Thread(target=self._run, daemon=True, name="hvdflow-mlflow")
        self._thread.start()

    def put(self, epoch: int, metrics: dict[str, float], kind: str = "epoch") -> None:
        """``metrics`` at MLflow step ``epoch`` (for ``kind="evaluation"``: an optimizer step,
        which ``close`` does not count among the epochs)."""
        with self._wake:
            self._pending.append((epoch, metrics, int(time.time() * 1000), kind))
            self._wake.notify()

    def close(self, flush_s: float) -> list[int]:
        """Wait up to ``flush_s`` for the buffer to drain; the epochs still unsent."""
        with self._wake:
            self._closing = True
            self._wake.notify()
        self._thread.join(flush_s)
        with self._wake:
            unsent = [epoch for epoch, _, _, kind in self._pending if kind == "epoch"]
            evaluations = sum(kind == "evaluation" for _, _, _, kind in self._pending)
        if evaluations:
            log_to_driver(f"MLflow: {evaluations} interval evaluation(s) not sent (in the log)")
        if unsent:
            log_to_driver(
                f"MLflow: epochs {[e + 1 for e in unsent]} not sent before training ended (the "
                "tracking server is still unreachable); the driver logs them from the history"
            )
        return unsent

    def _run(self) -> None:
        import mlflow.entities  # noqa: F401, PLC0415  (imported here, not in the first timed send)

        outage = _Outage()
        while True:
            with self._wake:
                while not self._pending and not self._closing:
                    self._wake.wait()
                if not self._pending:
                    return
                epoch, metrics, at, kind = self._pending[0]
            # A server that goes down in the middle of a send holds it in MLflow's own retries
            # (minutes of backoff) without an error: a send slower than retry_s is an outage too.
            slow = threading.Timer(self.retry_s, outage.begin, (epoch, "no answer"))
            slow.daemon = True
            slow.start()
            try:
                self._send(epoch, metrics, at)
            except Exception as e:  # the server is down or refusing: keep the epoch, retry
                slow.cancel()
                outage.begin(epoch, type(e).__name__)
                with self._wake:
                    self._wake.wait(self.retry_s)
                continue
            slow.cancel()
            with self._wake:
                self._pending.popleft()
                if kind == "epoch":
                    self.sent.append(epoch)
            outage.end()

    def _send(self, epoch: int, metrics: dict[str, float], at: int) -> None:
        from mlflow.entities import Metric  # noqa: PLC0415 (lazy: it loads Spark)

        if self._probe:
            # A quick probe first: MLflow's own retries would hold an epoch for minutes before
            # saying anything about a server that is down.
            import mlflow  # noqa: PLC0415 (lazy: it loads Spark)

            check_reachable(mlflow.get_tracking_uri())
            self._client = self._client or mlflow.MlflowClient()
        batch = [Metric(k, v, at, epoch) for k, v in sorted(metrics.items())]
        if batch:
            self._client.log_batch(self.run_id, metrics=batch)


class _Outage:
    """Says once when the tracking server stops answering, and once when it is back."""

    def __init__(self):
        self._lock = threading.Lock()
        self._since = None

    def begin(self, epoch: int, why: str) -> None:
        with self._lock:
            if self._since is not None:
                return
            self._since = time.time()
        log_to_driver(
            f"MLflow: could not log epoch {epoch + 1} ({why}); training goes on, its metrics "
            "are kept and sent when the tracking server is back"
        )

    def end(self) -> None:
        with self._lock:
            since, self._since = self._since, None
        if since is not None:
            log_to_driver(
                f"MLflow: tracking server back after {time.time() - since:.0f} s; "
                "sending the buffered epochs"
            )
