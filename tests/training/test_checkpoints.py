"""Checkpoints on a disk that fills: the write fails as a DiskFullError that says where, and the
last complete checkpoint still counts (a real tmpfs that runs out of space, not a mocked error)."""

from __future__ import annotations

import tempfile

import numpy as np
import pytest

from hvdflow.infra.errors import DiskFullError, TransientError
from hvdflow.training.checkpoints import CheckpointState, CheckpointStore
from tests.helpers import resize_disk, small_disk

pytestmark = pytest.mark.integration

KERNEL_KIB = 784 * 64 * 4 // 1024  # the model's one big variable: 196 KiB a checkpoint


def model_checkpoint(value: float):
    import tensorflow as tf

    model = tf.keras.Sequential([tf.keras.Input((784,)), tf.keras.layers.Dense(64)])
    for weight in model.weights:
        weight.assign(tf.fill(weight.shape, value))
    return model, tf.train.Checkpoint(model=model)


def kernel(model) -> float:
    return float(np.unique(model.weights[0].numpy())[0])


def test_a_checkpoint_folder_that_fills_keeps_the_last_complete_checkpoint(tmp_path):
    with small_disk(tmp_path / "disk", KERNEL_KIB + 64) as disk:
        store = CheckpointStore(str(disk / "run"))
        _, first = model_checkpoint(1.0)
        store.save(first, CheckpointState(1, "epoch-0001"))

        _, second = model_checkpoint(2.0)
        with pytest.raises(DiskFullError) as failed:
            store.save(second, CheckpointState(2, "epoch-0002"))
        message = str(failed.value)
        assert "checkpoint epoch-0002 could not be written: no space left on device" in message
        assert str(disk / "run") in message and "last complete checkpoint still counts" in message
        assert isinstance(failed.value, TransientError)  # the training step tries again

        latest = store.latest()
        assert latest.epoch == 1 and latest.folder == "epoch-0001"
        restored, checkpoint = model_checkpoint(0.0)
        store.restore(checkpoint, latest)
        assert kernel(restored) == 1.0
        store.close()  # the restored files' folder goes (the trainer closes after a step)

        # Room again: the next attempt's save goes through and counts.
        resize_disk(disk, 4 * KERNEL_KIB + 256)
        store.save(second, CheckpointState(2, "epoch-0002"))
        assert store.latest().epoch == 2


def test_a_full_temporary_folder_says_so_and_publishes_nothing(tmp_path, monkeypatch):
    with small_disk(tmp_path / "tmp", KERNEL_KIB // 2) as tmp:
        monkeypatch.setattr(tempfile, "tempdir", str(tmp))  # the rank's TMPDIR
        store = CheckpointStore(str(tmp_path / "run"))
        _, checkpoint = model_checkpoint(1.0)
        with pytest.raises(DiskFullError) as failed:
            store.save(checkpoint, CheckpointState(1, "epoch-0001"))
        assert "written here before it is uploaded" in str(failed.value)
        assert "TMPDIR" in str(failed.value)
        assert store.latest() is None
        assert list(tmp.iterdir()) == []  # the partial write went with its temporary folder


def test_a_torch_checkpoint_on_a_full_temporary_folder_says_so_too(tmp_path, monkeypatch):
    # torch.save's own writer reports a full disk without ENOSPC ("unexpected pos"): the
    # trainer's checkpoint writes through Python, so the soak's disk_full is told apart.
    torch = pytest.importorskip("torch", reason="torch is not installed (the classic profile)")
    from hvdflow.training.torch_trainer import _TorchCheckpoint

    model = torch.nn.Linear(784, 64)  # 196 KiB of weights, and as much again for Adam
    optimizer = torch.optim.Adam(model.parameters())
    with small_disk(tmp_path / "tmp", KERNEL_KIB // 2) as tmp:
        monkeypatch.setattr(tempfile, "tempdir", str(tmp))  # the rank's TMPDIR
        store = CheckpointStore(str(tmp_path / "run"))
        with pytest.raises(DiskFullError) as failed:
            store.save(_TorchCheckpoint(model, optimizer), CheckpointState(1, "epoch-0001"))
        assert "checkpoint epoch-0001 could not be written: no space left" in str(failed.value)
        assert store.latest() is None
        assert list(tmp.iterdir()) == []
        resize_disk(tmp, 4 * KERNEL_KIB + 256)
        store.save(_TorchCheckpoint(model, optimizer), CheckpointState(1, "epoch-0001"))
        assert store.latest().epoch == 1


def test_a_full_temporary_folder_while_restoring_says_so_and_keeps_the_checkpoint(
    tmp_path, monkeypatch
):
    # Seen in the soak: a rank resuming after a fault met a full /tmp while it downloaded the
    # checkpoint, and a bare OSError ended the run instead of the training step trying again.
    store = CheckpointStore(str(tmp_path / "run"))
    _, checkpoint = model_checkpoint(1.0)
    store.save(checkpoint, CheckpointState(1, "epoch-0001"))
    with small_disk(tmp_path / "tmp", KERNEL_KIB // 2) as tmp:
        monkeypatch.setattr(tempfile, "tempdir", str(tmp))  # the rank's TMPDIR
        restored, checkpoint = model_checkpoint(0.0)
        with pytest.raises(DiskFullError) as failed:
            store.restore(checkpoint, store.latest())
        message = str(failed.value)
        assert "checkpoint epoch-0001 could not be restored: no space left" in message, message
        assert str(tmp) in message and "TMPDIR" in message
        assert f"intact in {tmp_path / 'run'}" in message
        assert isinstance(failed.value, TransientError)  # the training step tries again
        assert list(tmp.iterdir()) == []  # the partial download went

        resize_disk(tmp, 4 * KERNEL_KIB + 256)
        store.restore(checkpoint, store.latest())
        assert kernel(restored) == 1.0
        store.close()
