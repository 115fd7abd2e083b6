"""Reading Horovod's timeline: shares of the wall clock, with exact values."""

import json

import pytest

from hvdflow.bench.timeline import breakdown, load_events, union_length


def span(tensor, name, begin_s, end_s):
    return [
        {"ph": "B", "name": name, "pid": tensor, "tid": 0, "ts": begin_s * 1e6},
        {"ph": "E", "pid": tensor, "tid": 0, "ts": end_s * 1e6},
    ]


@pytest.mark.unit
def test_overlapping_spans_of_fused_tensors_count_once():
    assert union_length([(0, 2), (1, 3), (5, 6)], 0, 10) == 4
    assert union_length([(0, 2), (1, 3), (5, 6)], 2.5, 5.5) == 1.0


@pytest.mark.unit
def test_the_breakdown_sets_waiting_and_reducing_against_the_wall_clock(tmp_path):
    # 10 s traced: two tensors wait together 0-2 s and alone 4-5 s, reduce 2-3 s and 5-6 s.
    events = [
        *span(1, "NEGOTIATE_ALLREDUCE", 0, 2),
        *span(2, "NEGOTIATE_ALLREDUCE", 1, 2),
        *span(1, "ALLREDUCE", 2, 3),
        *span(2, "NEGOTIATE_ALLREDUCE", 4, 5),
        *span(2, "ALLREDUCE", 5, 6),
        *span(3, "CYCLE_START", 9.5, 10),
    ]
    shares = breakdown(events)
    assert shares == pytest.approx(
        {"traced_s": 10.0, "waiting_for_peer": 0.3, "allreduce": 0.2, "compute_and_input": 0.5}
    )
    # The warm-up left out: from 4 s on, 1 s of 6 waiting, 1 s reducing.
    assert breakdown(events, skip_first_s=4)["waiting_for_peer"] == pytest.approx(1 / 6)
    # A timeline whose writer was stopped mid-file still reads.
    cut = tmp_path / "timeline.json"
    cut.write_text(json.dumps(events)[:-1] + ",\n")
    assert load_events(str(cut)) == events
