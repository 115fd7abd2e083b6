"""A training function and script written for pyspark's TorchDistributor, unchanged: DDP over
gloo, ``init_process_group()`` from the environment torchrun gives each process.

Both train a small classifier on a fixed synthetic set, each rank on its own shard
(DistributedSampler), and report a checksum of the final weights from every rank, so that a
test can see that DDP kept the replicas identical.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os


def train(
    epochs: int = 3,
    learning_rate: float = 0.1,
    die_in_epoch: int | None = None,
    checkpoint: str | None = None,
):
    """``die_in_epoch``: rank 1 SIGKILLs itself as that epoch begins, on the first attempt
    (TORCHELASTIC_RESTART_COUNT 0). ``checkpoint``: a file rank 0 saves after every epoch and
    every rank resumes from, as a torchrun script with --max-restarts does."""
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP
    from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    features = torch.randn(512, 8)
    labels = (features[:, 0] + features[:, 1] > 0).long()
    data = TensorDataset(features, labels)
    sampler = DistributedSampler(data, num_replicas=world, rank=rank, shuffle=True, seed=0)
    loader = DataLoader(data, batch_size=32, sampler=sampler)
    layers = [torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2)]
    model = DDP(torch.nn.Sequential(*layers))
    optimizer = torch.optim.SGD(model.parameters(), lr=learning_rate)
    first_epoch = 0
    if checkpoint and os.path.exists(checkpoint):
        state = torch.load(checkpoint)
        model.module.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        first_epoch = state["epochs_done"]
        print(f"resumed after epoch {first_epoch}", flush=True)
    restart = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    for epoch in range(first_epoch, epochs):
        sampler.set_epoch(epoch)
        if die_in_epoch == epoch and rank == 1 and restart == "0":
            print("rank 1 about to die", flush=True)
            os.kill(os.getpid(), 9)
        for x, y in loader:
            optimizer.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
            optimizer.step()
        print(f"epoch {epoch + 1} done", flush=True)
        if checkpoint and rank == 0:
            state = {"model": model.module.state_dict(), "optimizer": optimizer.state_dict()}
            torch.save({**state, "epochs_done": epoch + 1}, checkpoint + ".tmp")
            os.replace(checkpoint + ".tmp", checkpoint)
        if checkpoint:
            dist.barrier()  # no rank starts an epoch before its predecessor is saved
    with torch.no_grad():
        accuracy = (model(features).argmax(1) == labels).float().mean().item()
    blob = b"".join(p.detach().numpy().tobytes() for p in model.module.parameters())
    checksums = [None] * world
    dist.all_gather_object(checksums, hashlib.sha256(blob).hexdigest())
    environment = {
        name: os.environ.get(name)
        for name in (
            "RANK",
            "WORLD_SIZE",
            "LOCAL_RANK",
            "LOCAL_WORLD_SIZE",
            "GROUP_RANK",
            "MASTER_ADDR",
            "MASTER_PORT",
            "TORCHELASTIC_RUN_ID",
            "OMP_NUM_THREADS",
            "CUDA_VISIBLE_DEVICES",
            "TORCHELASTIC_RESTART_COUNT",
            "TORCHELASTIC_MAX_RESTARTS",
        )
    }
    environments = [None] * world
    dist.all_gather_object(environments, environment)
    dist.destroy_process_group()
    return {"accuracy": accuracy, "checksums": checksums, "environments": environments}


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    result = train(epochs=args.epochs)
    with open(f"{args.out}.{os.environ['RANK']}", "w") as f:
        json.dump(result, f)
