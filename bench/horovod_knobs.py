"""Why Horovod trails TensorFlow's collectives here: two ranks of one thread, knob by knob.

Two ranks of one thread each (the benchmark's hvd2 and tf2) train the MNIST CNN on the
benchmark's dataset, alternating in each round: Horovod as configured by default (its
background thread wakes every 1 ms), Horovod with a 10 ms cycle (HOROVOD_CYCLE_TIME), Horovod
sending fp16 gradients, and the tf_collective engine. Steady-state images/s (the first epoch
left out) of each, best of the rounds.

    .venv/bin/python -m bench.horovod_knobs --dataset DATASET_FOLDER [--rounds 1]

DATASET_FOLDER holds a published dataset's ``manifest.json`` (for ``hvdflow bench``:
``$HVDFLOW_HOME/datasets/<fingerprint>``).
"""

from __future__ import annotations

import argparse
import json
import sys

from bench.reader_in_rank import steady_images_per_s
from bench.study import study_kwargs


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dataset", required=True, help="a published dataset's folder")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--epochs", type=int, default=2)
    args = parser.parse_args(argv)

    from infra import HorovodOptions, HorovodRunner
    from training.trainer import train_classifier

    kwargs = study_kwargs(args.dataset, args.epochs)
    variants = {
        "hvd2 (default, 1 ms cycle)": ("horovod", HorovodOptions(), {}),
        "hvd2 cycle_time_ms=10": ("horovod", HorovodOptions(cycle_time_ms=10), {}),
        "hvd2 fp16_compression": ("horovod", HorovodOptions(), {"fp16_compression": True}),
        "tf2": ("tf_collective", HorovodOptions(), {}),
    }
    rates: dict[str, list[float]] = {name: [] for name in variants}
    for round_ in range(args.rounds):
        for name, (engine, options, extra) in variants.items():
            runner = HorovodRunner(np=2, engine=engine, horovod=options)
            result = runner.run(train_classifier, **kwargs, **extra, engine=engine)
            rates[name].append(steady_images_per_s(result))
            print(f"round {round_ + 1}: {name:<28} {rates[name][-1]:7.1f} images/s", flush=True)
    print(json.dumps({name: max(values) for name, values in rates.items()}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
