"""Where a rank writes TensorFlow's profile, and how rank 0's reaches the MLflow run.

``TrainSpec.profile_batches`` asks for a profile (``training.callbacks.ProfileCallback`` takes
it). With ``profile_dir`` every rank writes into a folder of its own there (the benchmark's
``step_profile``); without, rank 0 alone profiles into a temporary folder, and after the fit its
profile goes to the run's artifacts with where the step's time went (``training.tf_profile``)
as metrics: what the pipeline's ``training.profile_batches`` does.
"""

from __future__ import annotations

import shutil
import tempfile
import time

from hvdflow.infra.launcher import log_to_driver
from hvdflow.training.spec import TrainSpec
from hvdflow.training.tf_profile import host_events, newest_profile, step_breakdown

# The step's wall clock, split (``training.tf_profile.step_breakdown``): each a metric
# ``profile_<share>_share`` beside ``profile_step_ms``.
SHARES = ("ops", "input", "waiting_in_step", "between_steps")


def profile_folder(spec: TrainSpec, rank: int) -> str | None:
    """Where this rank writes TensorFlow's profile, or None: ``<profile_dir>/rank<N>``, or for
    rank 0 of a tracked run without a ``profile_dir`` a temporary folder, logged after the fit."""
    if spec.profile_batches == (0, 0):
        return None
    if spec.profile_dir:
        return f"{spec.profile_dir}/rank{rank}"
    if rank == 0 and spec.tracking:
        return tempfile.mkdtemp(prefix="hvdflow-profile-")
    if rank == 0:
        log_to_driver(
            f"profile_batches {list(spec.profile_batches)}: no profile taken, this training "
            "logs to no MLflow run; give it a profile_dir for the ranks to write to"
        )
    return None


def log_profile(folder: str, spec: TrainSpec) -> dict | None:
    """Log rank 0's profile to the tracking run: the profile under ``profile/`` (TensorBoard's
    profile tab reads it), where a step's time went as metrics (``profile_*``) and with the
    heaviest kernels in ``profile/summary.json``. A profile is a diagnosis: a profile that
    cannot be read or logged is said, and the training goes on to register its model."""
    from mlflow import MlflowClient
    from mlflow.entities import Metric
    from mlflow.exceptions import MlflowException

    start, stop = spec.profile_batches
    run_id = spec.tracking.run_id
    try:
        shares = step_breakdown(host_events(newest_profile(folder)))
        client = MlflowClient()
        client.log_artifacts(run_id, folder, "profile")
        if shares:
            client.log_dict(run_id, shares, "profile/summary.json")
            now = int(time.time() * 1000)
            metrics = [Metric("profile_step_ms", shares["step_ms"], now, 0)] + [
                Metric(f"profile_{share}_share", shares[share], now, 0) for share in SHARES
            ]
            client.log_batch(run_id, metrics=metrics)
    except (OSError, MlflowException) as e:
        log_to_driver(f"TensorFlow's profile of batches [{start}, {stop}) was not logged: {e}")
        return None
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    where = "its artifacts' profile/ folder; `tensorboard --logdir` on a download of it"
    if not shares:
        log_to_driver(
            f"TensorFlow's profile of batches [{start}, {stop}) on rank 0 holds no training "
            f"step (did the training have {stop} batches?); in the MLflow run: {where}"
        )
        return shares
    log_to_driver(
        f"TensorFlow's profile of batches [{start}, {stop}) on rank 0: "
        f"{describe_breakdown(shares)}; in the MLflow run: {where}"
    )
    return shares


def describe_breakdown(shares: dict) -> str:
    """Where a step went, in the words the driver's log and the flow's summary both use."""
    return (
        f"step {shares['step_ms']:.1f} ms, ops running {shares['ops']:.0%}, input "
        f"{shares['input']:.0%}, waiting for allreduces {shares['waiting_in_step']:.0%}, "
        f"between steps {shares['between_steps']:.0%}"
    )


def breakdown_from_metrics(metrics: dict[str, float]) -> dict | None:
    """The step breakdown back from a run's ``profile_*`` metrics; None if it logged none."""
    if "profile_step_ms" not in metrics:
        return None
    shares = {share: metrics.get(f"profile_{share}_share", 0.0) for share in SHARES}
    return {"step_ms": metrics["profile_step_ms"], **shares}
