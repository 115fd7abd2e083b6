"""The PyTorch training function: the same ``TrainSpec`` and ``RankResult`` as
``training.trainer``'s Keras one, with DistributedDataParallel over gloo (nccl on GPUs).

Run by the launcher's ``torch`` engine (or ``TorchDistributor``), which gives each rank torchrun's
environment; without it (the benchmark's baseline) it trains alone. A run reads the same whichever
framework trained it: the same shards, batch and learning-rate rules, epoch lines, MLflow metrics,
checkpoints and verdicts as the Keras trainer.

Rank 0 registers a ``serving.torch_classifier.TorchImageClassifier`` (TorchScript inside). Not
here: interval evaluations, mixed precision and the profiler, which the parameters refuse.
"""

from __future__ import annotations

import io
import math
import os
import tempfile
import time

import numpy as np

from hvdflow.infra.launcher import log_to_driver, report_progress
from hvdflow.training.checkpoints import CheckpointState, CheckpointStore, epoch_folder
from hvdflow.training.epoch_log import (
    INPUT_WAIT_WARN,
    epoch_done_line,
    epoch_started_line,
    input_wait_warning,
)
from hvdflow.training.finish import (
    class_labels,
    finish_training,
    plan_training,
    register_model,
    track_to,
)
from hvdflow.training.models import model_input_shape
from hvdflow.training.quality import divergence
from hvdflow.training.reader import load_shard
from hvdflow.training.result import RankResult
from hvdflow.training.spec import TrainSpec
from hvdflow.training.torch_models import build_torch_model, make_torch_optimizer, torch_images

# What torch.save writes into a checkpoint folder (the store names the folder).
_CHECKPOINT_FILE = "torch.pt"


def train_classifier_torch(spec: TrainSpec) -> RankResult:
    """Train ``spec`` on this rank with PyTorch; rank 0 logs its epochs (and to MLflow when
    ``spec.tracking``) and writes the checkpoints. Returns what ``train_classifier`` returns."""
    import torch
    import torch.distributed as dist

    distributed = spec.use_horovod and "WORLD_SIZE" in os.environ
    device = rank_device()
    if distributed:
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    rank = dist.get_rank() if distributed else 0
    size = dist.get_world_size() if distributed else 1
    # The launcher sets OMP_NUM_THREADS to the rank's share of its host; alone, every core.
    threads = spec.threads or int(os.environ.get("OMP_NUM_THREADS") or 0)
    torch.set_num_threads(threads or len(os.sched_getaffinity(0)))
    data = spec.data
    batch, steps, plan = plan_training(spec, rank, size, f"PyTorch {torch.__version__}")
    model = build_torch_model(spec.model_name, data.input_shape, data.num_classes, seed=spec.seed)
    model.to(device)  # before the optimizer: its state lives where the parameters do
    optimizer = make_torch_optimizer(spec.optimizer.name, model.parameters(), plan.base)
    checkpoints, resumed = _resume(spec, model, optimizer, rank)
    network = model
    if distributed:
        ids = [device.index] if device.type == "cuda" else None
        network = torch.nn.parallel.DistributedDataParallel(model, device_ids=ids)

    # The shard stays in host memory (pinned on a GPU host); each batch is copied over.
    images, labels = load_shard(data.train_url, rank=rank, size=size, reader="pyarrow")
    train_x, train_y = _host_tensors(images, labels, device)
    val_x = val_y = None
    if data.val_rows:
        images, labels = load_shard(data.val_url, rank=rank, size=size, reader="pyarrow")
        val_x, val_y = _host_tensors(images, labels, device)

    history = {k: list(v) for k, v in (resumed.history if resumed else {}).items()}
    epoch_times = list(resumed.epoch_times) if resumed else []
    first = min(resumed.epoch if resumed else 0, spec.epochs)
    metrics = _metrics_sender(spec) if rank == 0 else None
    stopped = None
    started = time.perf_counter()
    warned = False
    for epoch in range(first, spec.epochs):
        if rank == 0:
            log_to_driver(epoch_started_line(epoch + 1, spec.epochs))
        began = time.perf_counter()
        logs = _train_epoch(
            network, optimizer, plan, train_x, train_y, epoch, steps, batch, spec.seed + rank
        )
        if val_x is not None:
            logs.update(_evaluate(network, val_x, val_y))
        logs = _summed_over_ranks(logs, distributed, device)
        took = time.perf_counter() - began
        logs["lr"] = plan.at_step((epoch + 1) * steps - 1)
        logs["epoch_time_s"] = took
        if rank == 0 and logs.get("input_wait_share", 0.0) > INPUT_WAIT_WARN and not warned:
            warned = True
            log_to_driver(input_wait_warning(logs["input_wait_share"], epoch + 1, rank))
        for key, value in logs.items():
            history.setdefault(key, []).append(value)
        epoch_times.append(took)
        if rank == 0:
            log_to_driver(epoch_done_line(epoch + 1, spec.epochs, took, logs))
            # The checkpoint first, then MLflow: an epoch whose checkpoint could not be written
            # is trained again by the next attempt, and must not be logged twice.
            if checkpoints is not None:
                _save(checkpoints, model, optimizer, epoch + 1, history, epoch_times)
            if metrics is not None:
                metrics.put(epoch, logs)
        if distributed:
            dist.barrier()  # no rank begins an epoch its checkpoint does not cover yet
        stopped = divergence(epoch + 1, logs, data.num_classes, plan.describe())
        if stopped:
            if rank == 0:
                log_to_driver(f"stopping: {stopped}")
            break
    train_s = time.perf_counter() - started
    report_progress(0, 0, watch=False)
    if metrics is not None:
        metrics.close(flush_s=60.0)
    if distributed:
        dist.destroy_process_group()

    def log_model():
        model.to("cpu")  # registry consumers load it on whatever they have
        example = (val_x if val_x is not None else train_x)[:4].permute(0, 2, 3, 1).numpy()
        return _log_model(model, example, spec)

    return finish_training(
        spec,
        rank=rank,
        size=size,
        plan=plan,
        history=history,
        epoch_times=epoch_times,
        train_seconds=train_s,
        steps=steps,
        batch=batch,
        resumed=resumed,
        stopped=stopped,
        registers=bool(spec.tracking and spec.tracking.registered_model_name),
        log_model=log_model,
    )


def _log_model(model, example: np.ndarray, spec: TrainSpec) -> tuple[str | None, dict | None]:
    """Log and register the TorchImageClassifier of ``model`` (TorchScript: consumers need no
    hvdflow code); evaluate it on the validation split."""
    import torch

    from hvdflow.serving.package import log_torch_classifier  # noqa: PLC0415 (lazy: MLflow)
    from hvdflow.serving.torch_classifier import TorchImageClassifier  # noqa: PLC0415

    model.eval()
    labels = class_labels(spec)
    shape = model_input_shape(spec.data.input_shape)
    with tempfile.TemporaryDirectory(prefix="hvdflow-model-") as scratch:
        path = f"{scratch}/network.pt"
        scripted = torch.jit.script(model)
        scripted.save(path)
        classifier = TorchImageClassifier(labels, shape)
        classifier.network = scripted
        return register_model(
            spec,
            lambda name: log_torch_classifier(path, shape, labels, example, name),
            classifier,
            "pyarrow",
        )


def rank_device():
    """This rank's GPU where it has one (the ``LOCAL_RANK``-th it sees), else the CPU."""
    import torch

    if not torch.cuda.is_available():
        return torch.device("cpu")
    index = int(os.environ.get("LOCAL_RANK", "0")) % torch.cuda.device_count()
    torch.cuda.set_device(index)
    return torch.device("cuda", index)


def _host_tensors(images, labels, device):
    import torch

    x, y = torch_images(images), torch.from_numpy(labels.astype(np.int64))
    if device.type == "cuda":  # pinned: the copy of each batch runs beside the computation
        x, y = x.pin_memory(), y.pin_memory()
    return x, y


def _train_epoch(network, optimizer, plan, x, y, epoch: int, steps: int, batch: int, seed: int):
    """One epoch of ``steps`` batches in an order seeded by the epoch; sums of loss and correct
    predictions over the images trained, and their count."""
    import torch

    device = next(network.parameters()).device
    network.train()
    order = np.random.default_rng((seed, epoch)).permutation(len(y))
    # A shard a little smaller than the average still gives every rank the same steps.
    order = np.resize(order, steps * batch)
    loss_sum, correct, waited, stepped = 0.0, 0, 0.0, 0.0
    for step in range(steps):
        began = time.perf_counter()
        rows = torch.from_numpy(order[step * batch : (step + 1) * batch])
        images = x[rows].to(device, non_blocking=True)
        labels = y[rows].to(device, non_blocking=True)
        waited += time.perf_counter() - began
        for group in optimizer.param_groups:
            group["lr"] = plan.at_step(epoch * steps + step)
        report_progress(epoch * steps + step + 1, epoch * steps + step)
        optimizer.zero_grad(set_to_none=True)
        logits = network(images)
        loss = torch.nn.functional.cross_entropy(logits, labels)
        loss.backward()
        optimizer.step()
        report_progress(epoch * steps + step + 1, epoch * steps + step + 1)
        loss_sum += float(loss.detach()) * len(labels)
        correct += int((logits.detach().argmax(1) == labels).sum())
        stepped += time.perf_counter() - began
    sums = {"loss": loss_sum, "accuracy": float(correct), "count": float(steps * batch)}
    return {**sums, "input_s": waited, "step_s": stepped}


def _evaluate(network, x, y, batch: int = 1024) -> dict[str, float]:
    """Sums of loss and correct predictions over this rank's whole validation shard."""
    import torch

    network.eval()
    loss_sum, correct = 0.0, 0
    module = getattr(network, "module", network)  # no gradient sync to wait for here
    device = next(module.parameters()).device
    with torch.no_grad():
        for start in range(0, len(y), batch):
            logits = module(x[start : start + batch].to(device, non_blocking=True))
            labels = y[start : start + batch].to(device, non_blocking=True)
            loss_sum += float(torch.nn.functional.cross_entropy(logits, labels, reduction="sum"))
            correct += int((logits.argmax(1) == labels).sum())
    return {"val_loss": loss_sum, "val_accuracy": float(correct), "val_count": float(len(y))}


def _summed_over_ranks(sums: dict[str, float], distributed: bool, device) -> dict[str, float]:
    """The epoch's metrics over every rank's images: the sums added up, then divided."""
    import torch
    import torch.distributed as dist

    keys = sorted(sums)
    values = torch.tensor([sums[k] for k in keys], dtype=torch.float64)
    if distributed:  # on the rank's device: NCCL reduces GPU tensors only
        values = values.to(device)
        dist.all_reduce(values)
        values = values.cpu()
    total = dict(zip(keys, values.tolist(), strict=True))
    logs = {
        "loss": total["loss"] / total["count"],
        "accuracy": total["accuracy"] / total["count"],
    }
    if total.get("step_s"):  # every rank's wait for its batches, over their step time
        logs["input_wait_share"] = total["input_s"] / total["step_s"]
    if "val_count" in total and total["val_count"]:
        logs["val_loss"] = total["val_loss"] / total["val_count"]
        logs["val_accuracy"] = total["val_accuracy"] / total["val_count"]
    if not math.isfinite(logs["loss"]):
        logs["loss"] = float("nan")
    return logs


def _metrics_sender(spec: TrainSpec):
    """Rank 0's epoch metrics to the tracking run, as the Keras trainer's callback sends them."""
    if not spec.tracking:
        return None
    from hvdflow.training.metrics_sender import EpochMetricsSender  # noqa: PLC0415

    return EpochMetricsSender(track_to(spec))


class _TorchCheckpoint:
    """The model and optimizer behind ``tf.train.Checkpoint``'s contract (``CheckpointStore``)."""

    def __init__(self, model, optimizer):
        self.model, self.optimizer = model, optimizer

    def write(self, prefix: str) -> None:
        import torch

        state = {"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict()}
        # Serialized in memory, written by Python: torch.save's own writer reports a full disk
        # as "unexpected pos", without ENOSPC; Python's raises OSError(ENOSPC), a DiskFullError.
        serialized = io.BytesIO()
        torch.save(state, serialized)
        with open(os.path.join(os.path.dirname(prefix), _CHECKPOINT_FILE), "wb") as f:
            f.write(serialized.getbuffer())

    def read(self, prefix: str):
        import torch

        device = next(self.model.parameters()).device  # written on a GPU, read anywhere
        path = os.path.join(os.path.dirname(prefix), _CHECKPOINT_FILE)
        state = torch.load(path, map_location=device)
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        return self

    def expect_partial(self) -> None:
        """Everything saved is restored: nothing to excuse."""


def _resume(spec: TrainSpec, model, optimizer, rank: int):
    """The checkpoint store and the checkpoint resumed from (or None): every rank loads it."""
    if not spec.checkpoint_url:
        return None, None
    checkpoints = CheckpointStore(spec.checkpoint_url, keep=spec.checkpoint_keep)
    resumed = checkpoints.latest()
    if resumed is not None:
        checkpoints.restore(_TorchCheckpoint(model, optimizer), resumed)
        checkpoints.close()
        if rank == 0:
            log_to_driver(
                f"resuming after epoch {resumed.epoch} from the checkpoint at "
                f"{checkpoints.url}/{resumed.folder}"
            )
    return checkpoints, resumed


def _save(checkpoints, model, optimizer, epochs_done: int, history, epoch_times) -> None:
    state = CheckpointState(
        epoch=epochs_done,
        folder=epoch_folder(epochs_done),
        history={k: list(v) for k, v in history.items()},
        epoch_times=list(epoch_times),
    )
    checkpoints.save(_TorchCheckpoint(model, optimizer), state)
