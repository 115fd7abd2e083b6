"""The benchmark's baseline as its own process: ``python -m training.baseline TRAINER JSON``.

A separate process, like a rank, so that both pay for starting Python and importing
TensorFlow; it prints the result as one JSON line. Output lines are tagged like rank 0's, so
the paper's log method reads them the same way.
"""

from __future__ import annotations

import json
import sys

from bench.conditions import trainer_for


def main(argv: list[str]) -> int:
    train = trainer_for(argv[1])
    kwargs = json.loads(argv[2])
    result = train(**kwargs, use_horovod=False)
    print("HVDFLOW_RESULT " + json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
