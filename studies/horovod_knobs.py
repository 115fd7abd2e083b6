"""Why Horovod trails TensorFlow's collectives here: two ranks of one thread, knob by knob.

Two ranks of one thread each (the benchmark's hvd2 and tf2) train the MNIST CNN on the
benchmark's dataset, alternating in each round: Horovod's background thread waking every 1 ms
(Horovod's default) and every 10 ms (HOROVOD_CYCLE_TIME; hvdflow's default on CPU ranks), or at
the cycles ``--cycles`` names; Horovod sending fp16 gradients; and the tf_collective engine.
``--binding`` compares instead each engine's ranks bound to a core each (hvdflow's default on
CPU ranks, ``infra/launcher/_cores.py``) and left to the scheduler (HVDFLOW_BIND_TO_CORES=0).
Steady-state images/s (the first epoch left out) of each, best of the rounds.

    .venv/bin/python -m studies.horovod_knobs --dataset DATASET_FOLDER \
        [--rounds 1] [--timeline P] [--cycles 1,10] [--cycles-only] [--binding]

DATASET_FOLDER holds a published dataset's ``manifest.json`` (for ``hvdflow bench``:
``$HVDFLOW_HOME/datasets/<fingerprint>``).
"""

from __future__ import annotations

import argparse
import json
import sys

from hvdflow.bench.study import study_spec
from hvdflow.bench.timeline import breakdown, load_events
from hvdflow.infra import HorovodOptions, HorovodRunner, LaunchOptions
from hvdflow.infra.constants import HVDFLOW_BIND_TO_CORES
from hvdflow.training.trainer import train_classifier
from studies.reader_in_rank import steady_images_per_s

# How the study's tables name two ranks of each engine.
ENGINE_NAMES = {"horovod": "hvd2", "tf_collective": "tf2"}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dataset", required=True, help="a published dataset's folder")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument(
        "--timeline",
        metavar="PATH",
        help="then run hvd2 with Horovod's timeline written to PATH and print where its steady "
        "epochs went (waiting for the peer, allreduce, compute and input)",
    )
    parser.add_argument(
        "--cycles",
        default="1,10",
        help="Horovod cycle times to compare, in ms (default 1,10: Horovod's and hvdflow's)",
    )
    parser.add_argument(
        "--cycles-only", action="store_true", help="leave out the fp16 and tf2 variants"
    )
    parser.add_argument(
        "--binding",
        action="store_true",
        help="compare ranks bound to cores and left unbound (only that)",
    )
    parser.add_argument(
        "--engines",
        default="horovod,tf_collective",
        help="with --binding: the engines to compare it on (default both)",
    )
    args = parser.parse_args(argv)
    unknown = set(args.engines.split(",")) - set(ENGINE_NAMES)
    if unknown:
        parser.error(f"--engines {args.engines}: expected horovod and/or tf_collective")

    spec = study_spec(args.dataset, args.epochs)
    variants = binding_variants(args.engines.split(",")) if args.binding else cycle_variants(args)
    rates: dict[str, list[float]] = {name: [] for name in variants}
    for round_ in range(args.rounds):
        # Every other round in reverse order, so that a machine growing slower or faster over
        # the run favours no variant.
        order = list(variants.items())
        for name, (engine, options, extra) in order[:: -1 if round_ % 2 else 1]:
            runner = HorovodRunner(np=2, options=LaunchOptions(engine=engine, horovod=options))
            result = runner.run(train_classifier, spec=spec.replace(**extra, engine=engine))
            rates[name].append(steady_images_per_s(result))
            accuracy = result.history["val_accuracy"][-1]
            print(
                f"round {round_ + 1}: {name:<28} {rates[name][-1]:7.1f} images/s, "
                f"final val_accuracy {accuracy:.4f}",
                flush=True,
            )
    print(json.dumps({name: max(values) for name, values in rates.items()}))
    if args.timeline:
        print(json.dumps(where_time_goes(spec, args.timeline)), flush=True)
    return 0


def cycle_variants(args) -> dict[str, tuple[str, HorovodOptions, dict]]:
    # Every cycle time set explicitly: hvdflow's CPU ranks default to 10 ms (infra.launcher).
    variants = {
        f"hvd2 cycle_time_ms={ms:g}": ("horovod", HorovodOptions(cycle_time_ms=ms), {})
        for ms in (float(v) for v in args.cycles.split(","))
    }
    if not args.cycles_only:
        fp16 = {"fp16_compression": True}
        variants["hvd2 fp16_compression"] = ("horovod", HorovodOptions(), fp16)
        variants["tf2"] = ("tf_collective", HorovodOptions(), {})
    return variants


def binding_variants(engines: list[str]) -> dict[str, tuple[str, HorovodOptions, dict]]:
    unbound = HorovodOptions(extra_env={HVDFLOW_BIND_TO_CORES: "0"})
    return {
        f"{ENGINE_NAMES[engine]} {label}": (engine, options, {})
        for engine in engines
        for label, options in (("bound to cores", HorovodOptions()), ("unbound", unbound))
    }


def where_time_goes(spec, path: str) -> dict[str, dict[str, float]]:
    """One more hvd2 run of each cycle time with Horovod's timeline on: the share of the steady
    epochs spent waiting for the peer, in the allreduce, and in compute and input (the timeline
    slows training, so its runs are not among the rates above)."""
    shares = {}
    for cycle in (1, 10):
        options = HorovodOptions(timeline_path=path, cycle_time_ms=cycle)
        result = HorovodRunner(np=2, options=LaunchOptions(horovod=options)).run(
            train_classifier, spec=spec
        )
        name = f"hvd2 cycle_time_ms={cycle}"
        shares[name] = breakdown(load_events(path), skip_first_s=result.epoch_times[0])
    return shares


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
