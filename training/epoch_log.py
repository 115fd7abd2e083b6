"""The epoch lines of the driver log: written by ``LogCallback``, read by the paper's method.

Pan, Liu and Zhou measured an epoch as the time between the first driver-log line showing
``Epoch y/z`` and the first showing ``Epoch y+1/z``, whichever rank printed it. The last epoch
ends at the first ``Epoch z/z done`` line, when there is one. Both sides of that contract live
here, so that the format cannot drift between the writer and the parser.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

_EPOCH = re.compile(r"Epoch (\d+)/(\d+)")
_DONE = re.compile(r"Epoch (\d+)/(\d+) done")
_EVALUATION = re.compile(
    r"Evaluation at step (\d+) \((\d+) images trained\): val_accuracy=([0-9.]+) on (\d+) "
    r"validation images in ([0-9.]+)s"
)


# A rank waiting for its batches this share of its step time or more is told once what to change
# (MLPerf Storage passes a loader that keeps an accelerator 90% busy: a wait of 10%).
INPUT_WAIT_WARN = 0.2


def input_wait_warning(share: float, epoch: int, rank: int) -> str:
    """What a rank whose steps waited ``share`` of their time for input in ``epoch`` is told."""
    return (
        f"rank {rank} waited for its input {share:.0%} of its step time in epoch {epoch} "
        f"(input_wait_share; over {INPUT_WAIT_WARN:.0%}): the reader is the limit; hold the shard "
        "in memory (training.in_memory_max_mb), store raw pixels (data.image_encoding='raw') or "
        "give each rank more cores"
    )


def epoch_started_line(epoch: int, epochs: int | None) -> str:
    """``Epoch y/z``, Keras' own progress header; ``epoch`` counts from 1."""
    return f"Epoch {epoch}/{epochs}"


def epoch_done_line(epoch: int, epochs: int | None, seconds: float, metrics: Mapping) -> str:
    """``Epoch y/z done in Ns: name=value, ...``; ``epoch`` counts from 1."""
    return f"Epoch {epoch}/{epochs} done in {seconds:.2f}s: {format_metrics(metrics)}"


def evaluation_line(step: int, images: int, accuracy: float, subset: int, seconds: float) -> str:
    """``Evaluation at step S (N images trained): val_accuracy=A on M validation images ...``:
    one evaluation of the fixed validation subset (``training.interval_eval``)."""
    return (
        f"Evaluation at step {step} ({images} images trained): val_accuracy={accuracy:.4f} "
        f"on {subset} validation images in {seconds:.2f}s"
    )


def evaluations(lines: Iterable) -> list[tuple[float, int, float, float]]:
    """``(time, images trained, val_accuracy, seconds it took)`` of every evaluation line, in
    the order seen, each step once (its first ``.time``)."""
    seen: dict[int, tuple[float, int, float, float]] = {}
    for line in sorted(lines, key=lambda line: line.time):
        if match := _EVALUATION.search(line.text):
            step, images, accuracy, _, took = match.groups()
            seen.setdefault(int(step), (line.time, int(images), float(accuracy), float(took)))
    return list(seen.values())


def format_metrics(metrics: Mapping | None) -> str:
    return ", ".join(f"{k}={v:.4f}" for k, v in sorted((metrics or {}).items()))


def epochs_done(text: str) -> tuple[int, int] | None:
    """``(epochs done, epochs)`` that one line shows: ``Epoch y/z`` means y-1 of z are done,
    ``Epoch y/z done ...`` means y are; None for any other line."""
    if match := _DONE.search(text):
        return int(match.group(1)), int(match.group(2))
    if match := _EPOCH.search(text):
        return int(match.group(1)) - 1, int(match.group(2))
    return None


def epoch_times_from_log(lines: Iterable) -> list[float]:
    """Seconds per epoch from LogLines (anything with ``.time`` and ``.text``), in order from the
    first epoch the lines show (a resumed training starts after its checkpoint's)."""
    by_number = epoch_times_by_number(lines)
    return [by_number[e] for e in sorted(by_number)]


def epoch_done_times(lines: Iterable) -> dict[int, float]:
    """When each epoch's ``Epoch y/z done`` line was first seen (its ``.time``), by epoch number
    (from 1): the moment its metrics reached the driver, whichever rank printed it."""
    done: dict[int, float] = {}
    for line in sorted(lines, key=lambda line: line.time):
        if match := _DONE.search(line.text):
            done.setdefault(int(match.group(1)), line.time)
    return done


def epoch_times_by_number(lines: Iterable) -> dict[int, float]:
    """Seconds of each epoch the lines show whole, by epoch number (from 1); contiguous from the
    first epoch that started, up to the first that did not end."""
    starts: dict[int, float] = {}
    ends: dict[int, float] = {}
    total = 0
    for line in sorted(lines, key=lambda line: line.time):
        if done := _DONE.search(line.text):
            ends.setdefault(int(done.group(1)), line.time)
            continue
        if match := _EPOCH.search(line.text):
            epoch, total = int(match.group(1)), int(match.group(2))
            starts.setdefault(epoch, line.time)
    times: dict[int, float] = {}
    for epoch in range(min(starts, default=1), total + 1):
        end = starts.get(epoch + 1, ends.get(epoch))
        if epoch not in starts or end is None:
            break
        times[epoch] = end - starts[epoch]
    return times
