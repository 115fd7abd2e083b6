"""The ``hvdflow`` command line."""

from __future__ import annotations

import argparse
import json
import logging
import sys


def _configure_logging(level: str) -> None:
    logging.basicConfig(
        level=getattr(logging, level.upper()),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    # Spark's and TensorFlow's Python loggers are chatty at INFO.
    for noisy in ("py4j", "pyspark"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


def _cmd_smoke(args: argparse.Namespace) -> int:
    from infra import HorovodRunner
    from training.smoke import train_digits

    runner = HorovodRunner(np=args.np, driver_log_verbosity=args.driver_log_verbosity)
    result = runner.run(train_digits, epochs=args.epochs)
    same = len(set(result["checksums"])) == 1
    print(json.dumps({**result, "identical_weights": same, "log": runner.log_path}, indent=2))
    return 0 if same and result["size"] == abs(args.np) else 1


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="hvdflow",
        description="Spark-to-deep-learning pipelines: preprocessing, barrier-mode Horovod "
        "training on Spark, MLflow tracking, on Prefect.",
    )
    parser.add_argument(
        "--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"]
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    smoke = commands.add_parser(
        "smoke",
        help="train a small model on the bundled digits with HorovodRunner and check that "
        "every rank ends with identical weights",
        description="Train a small model on the bundled digits with HorovodRunner; exits 1 "
        "unless every rank ends with identical weights. The Spark master comes from "
        "$HVDFLOW_SPARK_MASTER (default local[N]).",
    )
    smoke.add_argument("--np", type=int, default=2, help="ranks (negative: on the driver)")
    smoke.add_argument("--epochs", type=int, default=2)
    smoke.add_argument(
        "--driver-log-verbosity", default="all", choices=["all", "log_callback_only"]
    )
    smoke.set_defaults(func=_cmd_smoke)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    _configure_logging(args.log_level)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
