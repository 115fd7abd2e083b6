"""Time to target round by round, checked with exact values (never with timings)."""

import pytest

from hvdflow.bench import time_to_target
from hvdflow.bench.conditions import Measurement


def run(condition, rep, evaluations, final=0.98, np_=1, train_s=100.0):
    """A measurement whose evaluations every few steps are ``[(seconds, accuracy), ...]``,
    each after 1,000 more images, each taking 1 s."""
    return Measurement(
        condition=condition,
        np=np_,
        repetition=rep,
        epoch_times=[train_s],
        epoch_times_log=[],
        wall_clock_s=train_s + 10,
        images=60_000,
        train_seconds=train_s,
        processes=max(np_, 1),
        val_accuracy=[final],
        evaluations=[[s, 1000 * (i + 1), a, 1.0] for i, (s, a) in enumerate(evaluations)],
    )


ROUNDS = [
    run("hvd1", 0, [(50, 0.90), (100, 0.971)], final=0.980),
    run("hvd2", 0, [(30, 0.95), (60, 0.972)], final=0.979, np_=2),
    run("hvd1", 1, [(50, 0.96), (100, 0.975)], final=0.982),
    run("hvd2", 1, [(30, 0.96), (60, 0.969), (90, 0.97)], final=0.981, np_=2),
    run("hvd1", 2, [(50, 0.97), (100, 0.99)], final=0.984),
    run("hvd2", 2, [(30, 0.90), (60, 0.95)], final=0.978, np_=2),  # never got there
]


@pytest.mark.unit
def test_the_first_evaluation_at_the_target_gives_the_time_and_the_images():
    first = ROUNDS[1]
    assert first.seconds_to(0.97) == 60 and first.images_to(0.97) == 2000
    assert first.seconds_to(0.99) is None and first.images_to(0.99) is None
    assert first.evaluation_share == pytest.approx(2 / 100)
    # Without evaluations every few steps: the epoch's end, as before.
    epochs_only = run("hvd1", 0, [], final=0.98)
    assert epochs_only.images_to(0.97) is None and epochs_only.evaluation_share is None
    assert epochs_only.seconds_to(0.97) == pytest.approx(10 + 100)


@pytest.mark.unit
def test_rounds_are_paired_and_a_round_that_never_reached_the_target_is_lost():
    rows = {r["condition"]: r for r in time_to_target.rows(ROUNDS, 0.97, "hvd1", ["hvd1", "hvd2"])}
    one, two = rows["hvd1"], rows["hvd2"]
    assert one["times_s"] == [100, 100, 50] and one["median_s"] == 100
    assert one["trimmed_mean_s"] == 100  # MLPerf's: 50 and one 100 dropped
    assert two["trimmed_mean_s"] is None
    assert one["median_vs_reference"] is None and one["paired_rounds"] == 0
    assert two["times_s"] == [60, 90, None]
    assert two["median_s"] is None  # a round that never got there: no median to boast of
    assert (two["first_in"], two["paired_rounds"]) == (2, 3)
    assert two["final_vs_reference_points"] == pytest.approx(100 * (0.9793333 - 0.982), abs=1e-4)
    table = time_to_target.markdown(list(rows.values()), 0.97, "hvd1")
    assert "| hvd2 | 60.0, 90.0, not reached | n/a | n/a | n/a | 2/3 |" in table
    assert "| hvd1 | 100.0, 100.0, 50.0 | 100.0 | 100.0 | n/a | - | 2000 |" in table


@pytest.mark.unit
def test_the_median_ratio_is_against_the_references_median(tmp_path):
    reached = [*ROUNDS[:5], run("hvd2", 2, [(30, 0.90), (45, 0.97)], np_=2)]
    two = time_to_target.rows(reached, 0.97, "hvd1", ["hvd1", "hvd2"])[1]
    assert two["median_s"] == 60 and two["median_vs_reference"] == pytest.approx(0.6)
    assert two["first_in"] == 3
    path = time_to_target.plot_curves(reached, tmp_path, "mnist_cnn", 0.97)
    assert path.name == "accuracy_over_time.png" and path.read_bytes()[:4] == b"\x89PNG"


@pytest.mark.unit
def test_the_trimmed_mean_drops_the_fastest_and_the_slowest_round():
    assert time_to_target.trimmed_mean([10.0, 30.0, 11.0, 12.0, 13.0]) == 12.0
    assert time_to_target.trimmed_mean([10.0, 20.0]) == 15.0  # too few to drop any
    assert time_to_target.trimmed_mean([]) is None


@pytest.mark.unit
def test_each_rounds_evaluations_become_metrics_at_the_images_trained():
    metrics = list(time_to_target.evaluation_metrics(ROUNDS[1:2]))
    assert metrics == [
        ("hvd2_r1_interval_val_accuracy", 0.95, 1000),
        ("hvd2_r1_interval_seconds", 30.0, 1000),
        ("hvd2_r1_interval_val_accuracy", 0.972, 2000),
        ("hvd2_r1_interval_seconds", 60.0, 2000),
    ]
