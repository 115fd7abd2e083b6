"""The benchmark's plain Keras baseline as its own process: ``python -m training.baseline JSON``.

A separate process, like a rank, so that both pay for starting Python and importing
TensorFlow; it prints the result as one JSON line. Output lines are tagged like rank 0's, so
the paper's log method reads them the same way.
"""

from __future__ import annotations

import json
import sys

from training.trainer import train_classifier


def main(argv: list[str]) -> int:
    kwargs = json.loads(argv[1])
    result = train_classifier(**kwargs, use_horovod=False)
    print("HVDFLOW_RESULT " + json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
