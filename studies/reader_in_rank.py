"""What the reader costs inside a training rank: streamed from Petastorm against held in memory.

One rank of one thread (HorovodRunner np=1, the benchmark's hvd1) trains the MNIST CNN on the
benchmark's dataset twice per round, alternating: once streaming every epoch from Petastorm
(reader threads, PNG decoding and a Python call per image, all sharing the rank's core with
training: ``in_memory_max_mb=0``), once reading its shard once and serving it from memory
(the default). Steady-state images/s (the first epoch left out) of each, and their ratio.

    .venv/bin/python -m studies.reader_in_rank --dataset DATASET_FOLDER [--rounds 2]

DATASET_FOLDER is a published dataset's folder, the one holding its ``manifest.json`` (for
``hvdflow bench``: ``$HVDFLOW_HOME/datasets/<fingerprint>``).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys

from hvdflow.bench.study import study_spec
from hvdflow.infra import HorovodRunner
from hvdflow.training.result import RankResult
from hvdflow.training.trainer import train_classifier


def steady_images_per_s(result: RankResult) -> float:
    steady = result.epoch_times[1:] or result.epoch_times
    return result.images_per_epoch / statistics.mean(steady)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dataset", required=True, help="a published dataset's folder")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=2)
    args = parser.parse_args(argv)

    spec = study_spec(args.dataset, args.epochs)
    rates: dict[str, list[float]] = {"streamed": [], "in memory": []}
    for round_ in range(args.rounds):
        for name, max_mb in (("streamed", 0.0), ("in memory", 1024.0)):
            result = HorovodRunner(np=1).run(
                train_classifier, spec=spec.replace(in_memory_max_mb=max_mb)
            )
            rates[name].append(steady_images_per_s(result))
            print(f"round {round_ + 1}: {name:>9} {rates[name][-1]:7.1f} images/s", flush=True)
    best = {name: max(values) for name, values in rates.items()}
    print(
        json.dumps(
            {
                "train_rows": spec.data.train_rows,
                "best_images_per_s": best,
                "ratio_in_memory_over_streamed": best["in memory"] / best["streamed"],
                "reader_share_of_streamed_epoch": 1 - best["streamed"] / best["in memory"],
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
