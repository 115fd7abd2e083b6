"""Where a Horovod rank's wall clock goes, read from Horovod's timeline (HOROVOD_TIMELINE).

The timeline is a Chrome trace written by rank 0: for every tensor, a ``B``/``E`` pair per
activity. ``NEGOTIATE_ALLREDUCE`` spans from rank 0 asking to reduce a tensor until every rank
has asked: time spent waiting for the peer. ``ALLREDUCE`` spans the reduction itself (with its
nested steps: queueing, copies into and out of the fusion buffer, Gloo's ring). Tensors are
fused, so their spans overlap: each activity is summed as the union of its spans, then set
against the wall clock they fall in. What neither covers is the rank's own compute and input.
"""

from __future__ import annotations

import json
from collections import defaultdict

from hvdflow.training.tf_profile import union_length

# The top-level activities, in the order a tensor goes through them.
WAITING, REDUCING = "NEGOTIATE_ALLREDUCE", "ALLREDUCE"


def load_events(path: str) -> list[dict]:
    """The trace's events; a timeline cut off mid-write (no closing bracket) still reads."""
    text = open(path).read().strip().rstrip(",")
    if not text.endswith("]"):
        text += "]"
    return json.loads(text)


def activity_spans(events: list[dict]) -> dict[str, list[tuple[float, float]]]:
    """activity -> (begin, end) spans in microseconds, paired per tensor (``pid``/``tid``)."""
    open_: dict[tuple, list[float]] = defaultdict(list)
    spans: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for event in events:
        phase, name = event.get("ph"), event.get("name")
        key = (event.get("pid"), event.get("tid"))
        if phase == "B" and name:
            open_[key].append((name, float(event["ts"])))
        elif phase == "E" and open_[key]:
            begun_name, begun = open_[key].pop()
            spans[begun_name].append((begun, float(event["ts"])))
    return dict(spans)


def breakdown(events: list[dict], skip_first_s: float = 0.0) -> dict[str, float]:
    """Fractions of the traced wall clock (after its first ``skip_first_s`` seconds, the
    warm-up): waiting for the peer, reducing, and the rest (compute and input)."""
    spans = activity_spans(events)
    times = [t for s in spans.values() for span in s for t in span]
    if not times:
        return {}
    start, end = min(times) + skip_first_s * 1e6, max(times)
    wall = max(end - start, 1e-9)
    waiting = union_length(spans.get(WAITING, []), start, end) / wall
    reducing = union_length(spans.get(REDUCING, []), start, end) / wall
    return {
        "traced_s": wall / 1e6,
        "waiting_for_peer": waiting,
        "allreduce": reducing,
        "compute_and_input": max(0.0, 1.0 - waiting - reducing),
    }
