"""The benchmark's baseline as its own process: ``python -m hvdflow.bench.baseline TRAINER JSON``.

A separate process, like a rank, so that both pay for starting Python and importing
TensorFlow; it prints the result (a ``RankResult``) as one JSON line. Output lines are tagged
like rank 0's, so the paper's log method reads them the same way.
"""

from __future__ import annotations

import json
import logging
import sys

from hvdflow.bench.conditions import trainer_for, with_options
from hvdflow.infra.launcher import _wire


def _show_driver_messages_on_stdout() -> None:
    """Outside a rank, ``log_to_driver`` logs instead; print those lines like rank 0's, so the
    paper's log method sees the same epoch lines (``Epoch z/z done`` too) in both conditions."""
    handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(logging.Formatter("%(message)s"))
    _wire.logger.addHandler(handler)
    _wire.logger.setLevel(logging.INFO)
    _wire.logger.propagate = False


def main(argv: list[str]) -> int:
    _show_driver_messages_on_stdout()
    train = trainer_for(argv[1])
    kwargs = with_options(argv[1], json.loads(argv[2]), use_horovod=False)
    result = train(**kwargs)
    print("HVDFLOW_RESULT " + json.dumps(result.to_dict()), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
