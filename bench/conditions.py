"""One benchmark condition, measured: the plain Keras baseline, or HorovodRunner with np ranks."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from dataclasses import dataclass

from infra import LogLine
from training.epoch_log import epoch_times_from_log

KERAS = "keras"


@dataclass(frozen=True)
class Measurement:
    condition: str  # "keras" or "np=<k>"
    np: int  # 0 for the baseline
    repetition: int
    epoch_times: list[float]  # callback method
    epoch_times_log: list[float]  # the paper's log method
    wall_clock_s: float  # launch included
    images: int  # images trained over all epochs

    @property
    def images_per_s(self) -> float:
        """The paper's measure: images trained / wall-clock."""
        return self.images / self.wall_clock_s

    @property
    def images_per_s_epoch(self) -> list[float]:
        per_epoch = self.images / max(1, len(self.epoch_times))
        return [per_epoch / t for t in self.epoch_times]


def parse_condition(text: str) -> tuple[str, int]:
    """``keras`` -> (keras, 0); ``2`` or ``np=2`` -> (np=2, 2)."""
    text = str(text).strip().lower()
    if text == KERAS:
        return KERAS, 0
    value = text.removeprefix("np=")
    if not value.isdigit() or int(value) < 1:
        raise ValueError(f"condition {text!r}: expected 'keras' or a number of ranks such as 2")
    return f"np={int(value)}", int(value)


def trainer_for(name: str):
    """The rank function of a trainer: ``classifier`` (images) or ``gcn`` (graphs)."""
    if name == "gcn":
        from training.gcn import train_gcn

        return train_gcn
    if name == "classifier":
        from training.trainer import train_classifier

        return train_classifier
    raise ValueError(f"trainer {name!r} is unknown: expected 'classifier' or 'gcn'")


def measure(
    condition: str,
    repetition: int,
    train_kwargs: dict,
    spark=None,
    trainer: str = "classifier",
    horovod=None,
) -> Measurement:
    name, np = parse_condition(condition)
    lines: list[LogLine] = []
    started = time.perf_counter()
    if np == 0:
        result = _run_baseline(trainer, train_kwargs, lines)
    else:
        from infra import HorovodRunner

        runner = HorovodRunner(np=np, spark=spark, horovod=horovod, on_log_line=lines.append)
        result = runner.run(trainer_for(trainer), **train_kwargs)
    wall = time.perf_counter() - started
    return Measurement(
        condition=name,
        np=np,
        repetition=repetition,
        epoch_times=result["epoch_times"],
        epoch_times_log=epoch_times_from_log(lines),
        wall_clock_s=wall,
        images=result["images_per_epoch"] * len(result["epoch_times"]),
    )


def _run_baseline(trainer: str, train_kwargs: dict, lines: list[LogLine]) -> dict:
    process = subprocess.Popen(
        [sys.executable, "-m", "bench.baseline", trainer, json.dumps(train_kwargs)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    result, tail = None, []
    for raw in process.stdout:
        text = raw.rstrip("\n")
        tail = (tail + [text])[-30:]
        if text.startswith("HVDFLOW_RESULT "):
            result = json.loads(text.removeprefix("HVDFLOW_RESULT "))
        else:
            lines.append(LogLine(time.time(), 0, "stdout", text))
    if process.wait() != 0 or result is None:
        raise RuntimeError(
            f"the Keras baseline failed (exit code {process.returncode}). Last lines:\n"
            + "\n".join(tail)
        )
    return result
