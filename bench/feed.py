"""Can the reader feed an accelerator? MLPerf Storage's test with an emulated one.

Each rank reads a preprocessed split as training would and "trains" by sleeping for an
accelerator's step time per batch (``PRESETS``, or milliseconds of the user's). As in MLPerf
Storage (mlcommons/storage, Rules.md 3.3.2), accelerator utilisation (AU) is the compute time
over the wall time, the run's first step (the reader's start) left out. The reader's CPU cost per
image then says how many such accelerators one core, and one host, keep at 90% AU.

Ranks are processes of this host, each with its own shard, pinned to ``cpus_per_rank`` cores
where asked: what one host's cores can feed. ``hvdflow bench-input`` is the command.
"""

from __future__ import annotations

import json
import os
import queue
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass
from multiprocessing import get_context

from hvdflow.infra.storage.access import S3Access
from hvdflow.infra.storage.attempts import MANIFEST
from hvdflow.infra.storage.files import Location
from hvdflow.infra.storage.uris import is_s3
from hvdflow.training import parquet_reader

AU_GOAL = 0.9  # MLPerf Storage's pass mark for its image workloads
FEEDS = ("tf.data", "numpy", "in-memory")


@dataclass(frozen=True)
class Accelerator:
    """A device's step: ``step_s`` seconds for a batch of ``batch`` images; where it comes from."""

    name: str
    step_s: float
    batch: int
    source: str

    def at_batch(self, batch: int | None) -> Accelerator:
        """The same device at another batch, its step time scaled with the images."""
        if not batch or batch == self.batch:
            return self
        return Accelerator(self.name, self.step_s * batch / self.batch, batch, self.source)


_OURS = "hvdflow's H200 figures, docs/benchmarks/gpu.md (batch on the device)"
_MLPERF = "MLPerf Storage's DLIO workload config (computation_time, batch_size)"
PRESETS = {
    "vgg16-h200-bf16": Accelerator("vgg16-h200-bf16", 128 / 1936.5, 128, _OURS),
    "vgg16-h200-fp32": Accelerator("vgg16-h200-fp32", 128 / 1266.0, 128, _OURS),
    "inceptionv3-h200-bf16": Accelerator("inceptionv3-h200-bf16", 128 / 542.3, 128, _OURS),
    "resnet50-h100": Accelerator("resnet50-h100", 0.224, 400, _MLPERF + ", resnet50_h100"),
    "resnet50-a100": Accelerator("resnet50-a100", 0.435, 400, _MLPERF + ", resnet50_a100"),
}


def accelerator(preset: str | None, step_ms: float | None = None, batch: int | None = None):
    """The preset's accelerator, or one of ``step_ms`` per batch of ``batch`` (default 128)."""
    if step_ms is not None:
        if step_ms <= 0:
            raise ValueError(f"step_ms={step_ms}: expected milliseconds per batch, above 0")
        return Accelerator(f"{step_ms:g} ms/batch", step_ms / 1000, batch or 128, "given")
    if preset not in PRESETS:
        raise ValueError(
            f"preset {preset!r} does not exist: expected one of {', '.join(PRESETS)}, "
            "or --step-ms N for N milliseconds per batch"
        )
    return PRESETS[preset].at_batch(batch)


@dataclass(frozen=True)
class EpochFeed:
    """One rank's epoch: its steps, images, time waiting for input and computing, CPU seconds."""

    rank: int
    epoch: int
    images: int
    wait_s: float
    compute_s: float
    cpu_s: float

    @property
    def au(self) -> float:
        return self.compute_s / max(self.compute_s + self.wait_s, 1e-12)

    @property
    def images_per_s(self) -> float:
        return self.images / max(self.compute_s + self.wait_s, 1e-12)

    @property
    def cpu_s_per_image(self) -> float:
        return self.cpu_s / max(self.images, 1)


def kept_at_goal(cpu_s_per_image: float, device: Accelerator, cores: int = 1) -> float:
    """Accelerators that ``cores`` reading cores keep at AU_GOAL: each then eats AU_GOAL of its
    batch per step."""
    needs = AU_GOAL * device.batch / device.step_s * cpu_s_per_image  # cores per accelerator
    return cores / max(needs, 1e-12)


def split_url(root: str, access: S3Access | None = None) -> str:
    """The training split of a preprocessed dataset: ``root`` is a split (it holds the split's
    description) or a dataset version (its manifest.json); anything else fails in one line."""
    access = access or (S3Access.from_env() if is_s3(root) else None)
    location = Location(root, access)
    manifest = location.read_bytes(MANIFEST)
    if manifest is not None:
        return json.loads(manifest)["train_url"]
    if location.read_bytes(parquet_reader.SCHEMA_FILE) is not None:
        return root
    there = sorted(os.listdir(root))[:8] if not is_s3(root) and os.path.isdir(root) else []
    raise ValueError(
        f"{root!r} is not a preprocessed dataset: it has neither {MANIFEST} nor "
        f"{parquet_reader.SCHEMA_FILE} (it holds: {', '.join(there) or 'nothing readable'}); "
        "give a dataset version folder <data.output>/<fingerprint> or one of its splits"
    )


def read_ahead(batches: Iterator, depth: int = 2) -> Iterator:
    """``batches`` produced on a thread, ``depth`` ahead: how a PyTorch loop overlaps reading
    with its step (pyarrow and numpy release the GIL for the copies). Closing it stops the
    thread; the thread's error is raised here."""
    ready: queue.Queue = queue.Queue(depth)
    stop = threading.Event()

    def put(item) -> bool:
        while not stop.is_set():
            try:
                ready.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def produce():
        try:
            for batch in batches:
                if not put((batch, None)):
                    return
        except Exception as e:  # noqa: BLE001 (raised again in the consumer)
            put((None, e))
        else:
            put((None, None))

    threading.Thread(target=produce, daemon=True, name="hvdflow-read-ahead").start()
    try:
        while True:
            batch, error = ready.get()
            if batch is None:
                if error is not None:
                    raise error
                return
            yield batch
    finally:
        stop.set()


def _fields(url: str):
    return parquet_reader.read_description(url).fields


def batches(url: str, feed: str, batch: int, rank: int, size: int, reader: str | None):
    """This rank's batches, forever, as its training would get them: ``tf.data`` (Keras ranks,
    float32 images), ``numpy`` (``parquet_reader.iter_batches`` read ahead: uint8, as a PyTorch
    rank copies them to its device) or ``in-memory`` (the shard loaded once, then tf.data)."""
    if feed not in FEEDS:
        raise ValueError(f"feed {feed!r}: expected one of {', '.join(FEEDS)}")
    if feed == "numpy":
        stream = parquet_reader.iter_batches(url, batch_size=batch, rank=rank, size=size)
        yield from read_ahead(stream)
        return
    if reader == "petastorm" and any(f.codec == "raw" for f in _fields(url)):
        raise ValueError(
            f"{url} stores raw pixels: Petastorm's reader decodes PNG and JPEG only; use pyarrow's"
        )
    from hvdflow.training.reader import open_dataset  # noqa: PLC0415 (lazy: it loads TensorFlow)

    shard = {"rank": rank, "size": size, "batch_size": batch, "reader": reader or "pyarrow"}
    with open_dataset(url, in_memory=feed == "in-memory", **shard) as dataset:
        yield from dataset.as_numpy_iterator()


def emulate(
    stream: Iterator,
    device: Accelerator,
    *,
    epochs: int,
    steps: int,
    rank: int = 0,
    step: Callable[[object], None] | None = None,
    report: Callable[[EpochFeed], None] = lambda feed: None,
    clock: Callable[[], float] = time.perf_counter,
) -> list[EpochFeed]:
    """``epochs`` of ``steps`` batches from ``stream``, each followed by the device's step
    (``step(batch)``; default: sleeping ``device.step_s``). The first step's wait is left out."""
    step = step or (lambda batch: time.sleep(device.step_s))
    feeds, first = [], True
    for epoch in range(1, epochs + 1):
        images, wait, compute, cpu = 0, 0.0, 0.0, time.process_time()
        for _ in range(steps):
            began = clock()
            batch = next(stream)
            got = clock()
            step(batch)
            wait += 0.0 if first else got - began
            compute += clock() - got
            images += len(batch[-1])  # the labels
            first = False
        feeds.append(EpochFeed(rank, epoch, images, wait, compute, time.process_time() - cpu))
        report(feeds[-1])
    return feeds


def feed_line(feed: EpochFeed, device: Accelerator) -> str:
    return (
        f"rank {feed.rank} epoch {feed.epoch}: AU {feed.au:.1%}, {feed.images_per_s:,.0f} "
        f"images/s, {feed.cpu_s_per_image * 1e3:.3f} CPU-ms/image, "
        f"{kept_at_goal(feed.cpu_s_per_image, device):.2f} {device.name} per core at "
        f"{AU_GOAL:.0%} AU"
    )


@dataclass(frozen=True)
class FeedRun:
    """What ``run_ranks`` runs: the split, the feed, the device, the ranks and how long."""

    url: str
    feed: str
    device: Accelerator
    np: int = 1
    epochs: int = 3
    reader: str | None = None
    cpus_per_rank: int = 0  # 0: unpinned


def pin_threads(cores) -> None:
    """Every thread of this process on ``cores``, and the threads they start: a thread's
    binding is its own (os.sched_setaffinity(0) binds the caller alone)."""
    for thread_id in os.listdir("/proc/self/task"):
        try:
            os.sched_setaffinity(int(thread_id), cores)
        except (ProcessLookupError, PermissionError):
            continue  # a thread that just ended


def _rank(run: FeedRun, rank: int) -> list[dict]:
    """One rank's epochs, its threads pinned to its own cores for the while."""
    pinned = run.cpus_per_rank and hasattr(os, "sched_setaffinity")
    before = os.sched_getaffinity(0) if pinned else None
    if pinned:
        cores = sorted(before)
        mine = [(rank * run.cpus_per_rank + i) % len(cores) for i in range(run.cpus_per_rank)]
        pin_threads({cores[i] for i in mine})
    try:
        shard = parquet_reader.ShardReader(run.url, rank=rank, size=run.np)
        rows = sum(shard.piece_rows(piece) for piece in shard.pieces())
        steps = max(1, rows // run.device.batch)
        stream = batches(run.url, run.feed, run.device.batch, rank, run.np, run.reader)
        line = lambda feed: print(feed_line(feed, run.device), flush=True)  # noqa: E731
        try:
            feeds = emulate(
                stream, run.device, epochs=run.epochs, steps=steps, rank=rank, report=line
            )
        finally:
            stream.close()
    finally:
        if pinned:
            pin_threads(before)
    return [asdict(feed) for feed in feeds]


def run_ranks(run: FeedRun) -> list[EpochFeed]:
    """Every rank's epochs; np=1 in this process, more as processes started afresh."""
    if run.np == 1:
        dicts = [_rank(run, 0)]
    else:
        with ProcessPoolExecutor(run.np, mp_context=get_context("spawn")) as ranks:
            dicts = list(ranks.map(_rank, [run] * run.np, range(run.np)))
    return [EpochFeed(**feed) for rank in dicts for feed in rank]


def totals(feeds: list[EpochFeed]) -> EpochFeed:
    """Epochs summed, as MLPerf Storage sums a run's compute and wall time for its AU."""
    keys = ("images", "wait_s", "compute_s", "cpu_s")
    return EpochFeed(feeds[0].rank, len(feeds), *(sum(getattr(f, k) for f in feeds) for k in keys))


def steady_cost(feeds: list[EpochFeed]) -> float:
    """CPU seconds per image over the epochs after the first (the first pays for imports and
    tracing), or over the one epoch there is."""
    steady = [feed for feed in feeds if feed.epoch > 1] or feeds
    return totals(steady).cpu_s_per_image


def summary(feeds: list[EpochFeed], device: Accelerator, host_cores: int | None = None) -> str:
    """A markdown table, a row per rank over all its epochs, and how many such accelerators one
    core and this host keep at AU_GOAL at the ranks' steady CPU cost per image."""
    host_cores = host_cores or os.cpu_count() or 1
    lines = [
        "| rank | epochs | images | AU | images/s | steady CPU-ms/image | per core at 90% AU |",
        "|---|---|---|---|---|---|---|",
    ]
    costs = []
    for rank in sorted({feed.rank for feed in feeds}):
        mine = [feed for feed in feeds if feed.rank == rank]
        total, cost = totals(mine), steady_cost(mine)
        costs.append(cost)
        lines.append(
            f"| {rank} | {len(mine)} | {total.images} | {total.au:.1%} | "
            f"{total.images_per_s:,.0f} | {cost * 1e3:.3f} | {kept_at_goal(cost, device):.2f} |"
        )
    cost = sum(costs) / len(costs)
    lines.append(
        f"\n{device.name}: {device.step_s * 1e3:.1f} ms per batch of {device.batch} "
        f"({device.batch / device.step_s:,.0f} images/s; {device.source}). At "
        f"{cost * 1e3:.3f} CPU-ms per image one core keeps {kept_at_goal(cost, device):.2f} "
        f"of them at {AU_GOAL:.0%} AU, this host's {host_cores} cores "
        f"{kept_at_goal(cost, device, host_cores):.1f}."
    )
    return "\n".join(lines)
