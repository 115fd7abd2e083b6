"""The paper's epoch-time method: time between the streamed lines that announce each epoch.

Pan, Liu and Zhou measured an epoch as the time between the first driver-log line showing
``Epoch y/z`` and the first showing ``Epoch y+1/z``, whichever rank printed it. The last
epoch ends at the first ``Epoch z/z done`` line (hvdflow's LogCallback), when there is one.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

_EPOCH = re.compile(r"Epoch (\d+)/(\d+)")
_DONE = re.compile(r"Epoch (\d+)/(\d+) done")


def epoch_times_from_log(lines: Iterable) -> list[float]:
    """Seconds per epoch from LogLines (anything with ``.time`` and ``.text``), in order."""
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
    times = []
    for epoch in range(1, total + 1):
        end = starts.get(epoch + 1, ends.get(epoch))
        if epoch not in starts or end is None:
            break
        times.append(end - starts[epoch])
    return times
