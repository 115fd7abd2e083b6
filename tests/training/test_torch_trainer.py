"""The PyTorch trainer (``training.torch_trainer``) on the bundled digits, through the launcher's
torch engine: more ranks train the same model, and a rank killed mid-training costs only the
epoch it was in."""

from __future__ import annotations

import os
import signal
import threading

import pytest

from hvdflow import HorovodRunner, LaunchOptions, RankFailed
from hvdflow.tasks.config import TrainingParams
from hvdflow.tasks.train.spec import training_spec
from hvdflow.training.epoch_log import epochs_done
from hvdflow.training.torch_models import build_torch_model
from hvdflow.training.torch_trainer import train_classifier_torch
from tests.helpers import rank_of, rank_processes, wait_for_no_ranks

pytestmark = pytest.mark.torch
TOLERANCE = 0.02  # as tests/training/test_scaling.py, for the Keras trainer


def _needs_torch():
    pytest.importorskip("torch", reason="torch is not installed (the classic profile has it)")


@pytest.mark.unit
def test_a_model_without_a_torch_version_is_refused_by_name():
    with pytest.raises(ValueError, match="model 'inceptionv3' has no PyTorch version"):
        build_torch_model("inceptionv3", (299, 299, 3), 10)


@pytest.mark.unit
def test_vgg16_in_torch_has_the_keras_networks_weights_and_pools_any_image_size():
    torch = pytest.importorskip("torch", reason="torch is not installed (the classic profile)")
    network = build_torch_model("vgg16", (32, 32, 3), 101, seed=0)
    # keras.applications.VGG16(include_top=False): 14,714,688 weights; the head 512 x 101 + 101.
    assert sum(p.numel() for p in network.parameters()) == 14_714_688 + 512 * 101 + 101
    assert network(torch.zeros(2, 3, 32, 32)).shape == (2, 101)


def _run(spec, np: int, **options):
    runner = HorovodRunner(np=-np, options=LaunchOptions(engine="torch", **options))
    return runner.run(train_classifier_torch, spec=spec), runner


@pytest.mark.slow
def test_np_2_ends_within_two_points_of_np_1_and_logs_each_epoch_once(digits_dataset):
    _needs_torch()
    spec = training_spec(TrainingParams(model="digits_mlp", epochs=6), digits_dataset)
    spec = spec.replace(reader="pyarrow", chance_margin=0.05)
    one, _ = _run(spec, 1)
    two, runner = _run(spec, 2)
    assert (one.size, two.size) == (1, 2)
    assert one.history["val_accuracy"][-1] > 0.9  # the Keras recipe trains in torch too
    assert two.history["val_accuracy"][-1] >= one.history["val_accuracy"][-1] - TOLERANCE
    assert one.rejected is None and two.rejected is None and two.stopped is None
    assert two.steps_per_epoch == digits_dataset.train_rows // (2 * spec.batch_size)
    log = open(runner.log_path).read()
    done = [line for line in log.splitlines() if "<log>:Epoch" in line and " done in " in line]
    assert [epochs_done(line.split("<log>:", 1)[1]) for line in done] == [
        (epoch, 6) for epoch in range(1, 7)
    ]
    assert "val_accuracy=" in done[-1]
    assert wait_for_no_ranks() == []


@pytest.mark.slow
def test_a_rank_killed_mid_training_resumes_from_the_last_checkpoint(digits_dataset, tmp_path):
    _needs_torch()
    spec = training_spec(TrainingParams(model="digits_mlp", epochs=4), digits_dataset)
    spec = spec.replace(reader="pyarrow", checkpoint_url=str(tmp_path / "checkpoints"))
    lines: list[str] = []
    killed = threading.Event()

    def kill_rank_1_in_epoch_3(line) -> None:
        lines.append(line.text)
        if line.text.startswith("Epoch 3/4") and " done" not in line.text and not killed.is_set():
            for proc in rank_processes():
                if rank_of(proc) == 1:
                    os.kill(proc.pid, signal.SIGKILL)
                    killed.set()

    with pytest.raises(RankFailed, match="rank 1 .* was killed by SIGKILL"):
        _run(spec, 2, on_log_line=kill_rank_1_in_epoch_3)
    assert killed.is_set()
    assert wait_for_no_ranks() == []
    result, runner = _run(spec, 2)
    assert result.resumed_from_epoch == 2  # epochs 1 and 2 were checkpointed before the kill
    assert len(result.history["val_accuracy"]) == 4 and len(result.epoch_times) == 4
    # Every epoch's wait for its batches, a share of its step time: from memory, a small one.
    assert len(result.history["input_wait_share"]) == 4
    assert all(0 <= share < 0.5 for share in result.history["input_wait_share"])
    log = open(runner.log_path).read()
    assert "resuming after epoch 2 from the checkpoint at" in log
    # Each epoch finished once over the two runs: 1 and 2 in the first, 3 and 4 in the second.
    finished = [t for t in lines if " done in " in t] + [
        line.split("<log>:", 1)[1] for line in log.splitlines() if " done in " in line
    ]
    assert [epochs_done(t) for t in finished] == [(1, 4), (2, 4), (3, 4), (4, 4)]
    assert result.history["val_accuracy"][-1] > 0.8
    assert wait_for_no_ranks() == []


@pytest.mark.slow
def test_an_epoch_whose_checkpoint_was_not_written_is_not_logged_to_mlflow(
    digits_dataset, mlflow_server, tmp_path, monkeypatch
):
    """The next attempt trains that epoch again: logged before its checkpoint, it was logged
    twice (the soak of 2026-11-30, seed 62: SeaweedFS down over a PyTorch checkpoint). Here an
    S3 server of the test's own stops as epoch 1 begins: the checkpoint's upload retries for
    seconds and gives up, time enough for epoch 1's metrics to reach MLflow were they sent
    first."""
    _needs_torch()
    from mlflow import MlflowClient

    from hvdflow.infra.services.seaweed import SeaweedServer
    from hvdflow.infra.storage.object_store import ObjectStore, ObjectStoreConfig
    from hvdflow.training.spec import TrackingSpec

    client = MlflowClient(mlflow_server.tracking_uri)
    run_id = client.create_run(client.create_experiment("torch-checkpoint-first")).info.run_id
    server = SeaweedServer(tmp_path / "seaweed").start()
    try:
        for name, value in server.env().items():  # the rank inherits this process's variables
            monkeypatch.setenv(name, value)
        bucket = ObjectStoreConfig(bucket="ckpt", endpoint_url=server.endpoint_url)
        ObjectStore(bucket).ensure_bucket()
        spec = training_spec(TrainingParams(model="digits_mlp", epochs=3), digits_dataset)
        spec = spec.replace(
            reader="pyarrow",
            checkpoint_url="s3://ckpt/torch-checkpoint-first",
            tracking=TrackingSpec(run_id, mlflow_server.tracking_uri),
        )

        def stop_the_store_as_epoch_1_begins(line) -> None:
            if line.text.startswith("Epoch 1/3") and " done" not in line.text:
                server.stop()

        with pytest.raises(RankFailed, match="rank 0 .*unreachable"):
            _run(spec, 1, on_log_line=stop_the_store_as_epoch_1_begins)
    finally:
        server.stop()
    assert client.get_metric_history(run_id, "val_accuracy") == []  # no checkpoint, no epoch
    assert wait_for_no_ranks() == []
