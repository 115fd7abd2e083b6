"""Where each rank writes TensorFlow's profile, and when none is taken."""

import pytest


@pytest.mark.unit
def test_where_each_rank_profiles(tmp_path, monkeypatch, caplog):
    import logging
    import os

    from hvdflow.training.profiling import profile_folder
    from hvdflow.training.spec import DataSpec, TrackingSpec, TrainSpec

    monkeypatch.delenv("HVDFLOW_EVENT_FD", raising=False)  # log_to_driver: to the log here
    spec = TrainSpec(
        data=DataSpec("file:///t", "file:///v", 10, 2, 10, (8, 8, 1)),
        model_name="digits_mlp",
        tracking=TrackingSpec("run-1", "http://127.0.0.1:5000", "m"),
        profile_dir=str(tmp_path),
        profile_batches=(3, 6),
    )
    assert profile_folder(spec.replace(profile_batches=(0, 0)), 0) is None
    # A folder given: every rank writes its own.
    assert profile_folder(spec, 1) == f"{tmp_path}/rank1"
    # None given: rank 0 alone, into a temporary folder it logs to the run afterwards.
    tracked = spec.replace(profile_dir=None)
    folder = profile_folder(tracked, 0)
    assert os.path.isdir(folder) and os.path.basename(folder).startswith("hvdflow-profile-")
    os.rmdir(folder)
    assert profile_folder(tracked, 1) is None
    # Neither a folder nor a run: nothing taken, and said.
    with caplog.at_level(logging.INFO):
        assert profile_folder(tracked.replace(tracking=None), 0) is None
    assert "profile_batches [3, 6]: no profile taken, this training logs to no MLflow run" in (
        caplog.text
    )


@pytest.mark.unit
def test_the_breakdown_comes_back_from_the_runs_metrics():
    from hvdflow.training.profiling import breakdown_from_metrics, describe_breakdown

    # As log_profile logs them, beside the run's other metrics.
    metrics = {
        "profile_step_ms": 22.4,
        "profile_ops_share": 0.021,
        "profile_input_share": 0.012,
        "profile_waiting_in_step_share": 0.43,
        "profile_between_steps_share": 0.537,
        "val_accuracy": 0.9,
    }
    shares = breakdown_from_metrics(metrics)
    assert shares == {
        "step_ms": 22.4,
        "ops": 0.021,
        "input": 0.012,
        "waiting_in_step": 0.43,
        "between_steps": 0.537,
    }
    assert describe_breakdown(shares) == (
        "step 22.4 ms, ops running 2%, input 1%, waiting for allreduces 43%, between steps 54%"
    )
    # A run that was not profiled.
    assert breakdown_from_metrics({"val_accuracy": 0.9}) is None
