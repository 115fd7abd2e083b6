"""The study's methodology and statistics, checked with exact values (never with timings)."""

from dataclasses import replace

import numpy as np
import pytest

from hvdflow.bench.conditions import (
    Condition,
    Measurement,
    concurrent_epoch_times,
    dataset_readers,
    parse_condition,
    seconds_since,
)
from hvdflow.bench.stats import (
    anova,
    markdown,
    plot,
    repetition_means,
    summary_table,
    tukey_against,
)
from hvdflow.bench.workloads import augmented_digits, total_for_training
from hvdflow.infra import LogLine
from hvdflow.training.epoch_log import epoch_done_line, epoch_done_times


def m(condition, kind, np_, times, rep=0, images_per_epoch=1000, processes=1, threads=1):
    return Measurement(
        condition=condition,
        np=np_,
        repetition=rep,
        epoch_times=times,
        epoch_times_log=[],
        wall_clock_s=sum(times) + 5.0,
        images=images_per_epoch * len(times),
        train_seconds=sum(times),
        processes=processes,
        threads=threads,
        kind=kind,
    )


# Two repetitions each; the first epoch of each is the warm-up (9 s) and is left out.
MEASUREMENTS = [
    m("keras", "keras", 0, [9.0, 0.5, 0.5], threads=0),
    m("keras", "keras", 0, [9.0, 0.5, 0.5], rep=1, threads=0),
    m("keras1", "keras", 0, [9.0, 1.0, 1.0]),
    m("keras1", "keras", 0, [9.0, 1.0, 1.0], rep=1),
    m("ceiling2", "ceiling", 0, [9.0, 1.25, 1.25], images_per_epoch=2000, processes=2),
    m("ceiling2", "ceiling", 0, [9.0, 1.25, 1.25], rep=1, images_per_epoch=2000, processes=2),
    m("hvd1", "hvd", 1, [9.0, 1.0, 1.0]),
    m("hvd1", "hvd", 1, [9.0, 1.0, 1.2], rep=1),
    m("hvd2", "hvd", 2, [9.0, 1.25, 1.25], images_per_epoch=2000, processes=2),
    m("hvd2", "hvd", 2, [9.0, 1.6, 1.6], rep=1, images_per_epoch=2000, processes=2),
    m("tf2", "tf", 2, [9.0, 1.25, 1.25], images_per_epoch=2000, processes=2),
    m("tf2", "tf", 2, [9.0, 1.25, 1.25], rep=1, images_per_epoch=2000, processes=2),
]


@pytest.mark.unit
@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("keras", Condition("keras", "keras", 0)),
        ("keras1", Condition("keras1", "keras", 1)),
        ("ceiling2", Condition("ceiling2", "ceiling", 2)),
        ("hvd2", Condition("hvd2", "hvd", 2)),
        ("2", Condition("hvd2", "hvd", 2)),
        ("np=4", Condition("hvd4", "hvd", 4)),
        ("TF2", Condition("tf2", "tf", 2)),
    ],
)
def test_conditions_parse_like_the_cli_writes_them(text, expected):
    assert parse_condition(text) == expected


@pytest.mark.unit
@pytest.mark.parametrize(
    ("conditions", "readers"),
    [
        (["keras", "keras1", "ceiling2", "hvd1", "hvd2", "tf2"], 2),
        (["hvd4", "tf2"], 4),
        # A study of Keras processes alone: each reads the dataset whole (it failed with
        # "np: Input should be greater than or equal to 1", input_value=0).
        (["keras1"], 1),
        (["keras", "ceiling2"], 1),
    ],
)
def test_the_dataset_has_a_shard_for_each_rank_of_the_widest_condition(conditions, readers):
    assert dataset_readers(conditions) == readers


@pytest.mark.unit
@pytest.mark.parametrize("text", ["0", "hvd0", "tf", "ceiling", "mpi2", "keras-1"])
def test_a_condition_that_names_nothing_is_refused(text):
    with pytest.raises(ValueError, match="expected keras, kerasN"):
        parse_condition(text)


@pytest.mark.unit
def test_steady_state_leaves_the_first_epoch_out_and_launch_is_wall_minus_fit():
    one = m("hvd2", "hvd", 2, [9.0, 1.0, 3.0], images_per_epoch=2000, processes=2)
    assert one.warmup_s == 9.0
    assert one.steady_epoch_times == [1.0, 3.0]
    assert one.steady_images_per_s == 2000 / 2.0
    assert one.launch_s == 5.0
    assert one.images_per_s == 6000 / 18.0  # the paper's wall-clock measure, for comparison
    assert m("x", "hvd", 1, [4.0]).steady_epoch_times == [4.0]  # one epoch: itself


@pytest.mark.unit
def test_processes_that_ran_at_once_last_as_long_as_the_slowest_each_epoch():
    assert concurrent_epoch_times([[9.0, 1.0, 1.5], [8.0, 1.2, 1.4]]) == [9.0, 1.2, 1.5]


@pytest.mark.unit
def test_the_table_measures_scaling_against_one_rank_and_the_machine_ceiling():
    rows = {r["condition"]: r for r in summary_table(MEASUREMENTS)}
    assert list(rows) == ["keras", "keras1", "ceiling2", "hvd1", "hvd2", "tf2"]
    # hvd1: 1000 / 1.0 and 1000 / 1.1 images/s in its two repetitions.
    hvd1 = (1000 / 1.0 + 1000 / 1.1) / 2
    assert rows["hvd1"]["images_per_s"] == pytest.approx(hvd1)
    assert rows["hvd1"]["epoch_time_mean_s"] == pytest.approx(1.05)
    assert rows["hvd1"]["epoch_time_std_s"] == pytest.approx(np.std([1.0, 1.1], ddof=1))
    assert rows["hvd1"]["warmup_s"] == 9.0 and rows["hvd1"]["launch_s"] == pytest.approx(5.0)
    hvd2 = (2000 / 1.25 + 2000 / 1.6) / 2
    assert rows["hvd2"]["scaling_efficiency"] == pytest.approx(hvd2 / (2 * hvd1))
    # The ceiling: two 1-thread processes at once against one alone (keras1, 1000 images/s).
    assert rows["ceiling2"]["scaling_efficiency"] == pytest.approx(1600 / 2000)
    assert rows["hvd2"]["of_ceiling"] == pytest.approx(hvd2 / 1600)
    assert rows["hvd2"]["vs_keras"] == pytest.approx(hvd2 / 2000)
    assert rows["hvd1"]["vs_keras1"] == pytest.approx(hvd1 / 1000)
    # The TF engine has no 1-rank condition here: it is scaled against Horovod's one rank.
    assert rows["tf2"]["scaling_efficiency"] == pytest.approx(1600 / (2 * hvd1))
    assert rows["keras"]["scaling_efficiency"] is None and rows["keras"]["vs_keras"] is None


@pytest.mark.unit
def test_anova_and_tukey_use_one_sample_per_repetition():
    assert repetition_means(MEASUREMENTS)["hvd1"] == [1.0, 1.1]
    f, p = anova(MEASUREMENTS)
    from scipy.stats import f_oneway, tukey_hsd

    groups = list(repetition_means(MEASUREMENTS).values())
    expected = f_oneway(*groups)
    assert (f, p) == (pytest.approx(expected.statistic), pytest.approx(expected.pvalue))
    tukey = tukey_against(MEASUREMENTS, "hvd1")
    names = ["keras", "keras1", "ceiling2", "hvd1", "hvd2", "tf2"]
    reference = tukey_hsd(*[repetition_means(MEASUREMENTS)[c] for c in names])
    assert tukey == {
        c: pytest.approx(reference.pvalue[i][3]) for i, c in enumerate(names) if c != "hvd1"
    }


@pytest.mark.unit
def test_markdown_has_the_papers_shape_and_the_plots_are_pngs(tmp_path):
    rows = summary_table(MEASUREMENTS)
    text = markdown(rows, anova(MEASUREMENTS))
    assert text.splitlines()[0].startswith(
        "| condition | processes x threads | warm-up epoch (s) | steady epoch mean ± std (s) "
        "| Tukey p vs hvd1 | steady images/s | scaling efficiency | of machine ceiling"
    )
    assert "| ceiling2 | 2 x 1 | 9.00 | 1.250 ± 0.000 |" in text
    assert "| 80.0% | n/a | n/a |" in text  # the ceiling's own row
    assert "One-way ANOVA on the per-repetition steady epoch times: F = " in text
    paths = plot(rows, tmp_path, "test")
    assert [p.name for p in paths] == ["images_per_s.png", "scaling_efficiency.png"]
    assert all(p.stat().st_size > 5000 and p.read_bytes()[:4] == b"\x89PNG" for p in paths)


@pytest.mark.unit
def test_the_augmented_workload_is_deterministic_and_mnist_shaped():
    images, labels = augmented_digits(50, seed=3)
    again, same_labels = augmented_digits(50, seed=3)
    assert images.shape == (50, 28, 28) and images.dtype == np.uint8
    assert np.array_equal(images, again) and np.array_equal(labels, same_labels)
    assert set(labels) <= set(range(10))
    assert not np.array_equal(images, augmented_digits(50, seed=4)[0])
    assert total_for_training(60_000, 0.05) == 63_158  # 60,000 left after a 5% split
    assert total_for_training(60_000, 0.0) == 60_000


@pytest.mark.unit
def test_ranks_without_a_thread_budget_are_shown_sharing_the_cores():
    shared = [m("hvd2", "hvd", 2, [2.0, 1.0], processes=2, threads=0)]
    assert "| hvd2 | 2 x shared |" in markdown(summary_table(shared), None)
    alone = [m("keras", "keras", 0, [2.0, 1.0], threads=0)]
    assert "| keras | 1 x all |" in markdown(summary_table(alone), None)


def with_accuracy(measurement, accuracies):
    return replace(measurement, val_accuracy=accuracies)


@pytest.mark.unit
def test_time_to_target_counts_launch_and_every_epoch_up_to_the_first_that_reached_it():
    # Launch 5 s (wall minus fit), then epochs of 9, 1 and 1 s; 0.95 is reached in epoch 2.
    one = with_accuracy(m("hvd1", "hvd", 1, [9.0, 1.0, 1.0]), [0.90, 0.95, 0.97])
    assert one.seconds_to(0.95) == pytest.approx(5.0 + 9.0 + 1.0)
    assert one.seconds_to(0.90) == pytest.approx(14.0)
    assert one.seconds_to(0.99) is None
    assert one.final_val_accuracy == 0.97


@pytest.mark.unit
def test_time_to_target_is_read_when_the_driver_saw_the_epoch_done_when_the_log_shows_it():
    launched = 1000.0
    lines = [
        LogLine(1004.0, 0, "stdout", "Epoch 1/3"),
        LogLine(1013.5, 1, "stdout", epoch_done_line(1, 3, 9.0, {"loss": 0.5})),
        LogLine(1013.0, 0, "stdout", epoch_done_line(1, 3, 9.0, {"loss": 0.5})),  # seen first
        LogLine(1014.5, 0, "stdout", epoch_done_line(2, 3, 1.0, {})),
    ]
    done = seconds_since(launched, epoch_done_times(lines))
    assert done == [13.0, 14.5]
    # Epoch 3's line never came: its target falls back to launch plus the epochs (5 + 11).
    one = replace(
        with_accuracy(m("hvd1", "hvd", 1, [9.0, 1.0, 1.0]), [0.90, 0.95, 0.97]), epoch_done_s=done
    )
    assert one.seconds_to(0.90) == 13.0
    assert one.seconds_to(0.95) == 14.5
    assert one.seconds_to(0.97) == pytest.approx(16.0)
    # A log with a gap (epoch 1's line lost) gives nothing past the gap.
    assert seconds_since(launched, {2: 1014.5}) == []


@pytest.mark.unit
def test_the_table_reports_accuracy_and_time_to_target_and_never_averages_a_miss():
    measured = [
        with_accuracy(m("hvd1", "hvd", 1, [9.0, 1.0, 1.0]), [0.90, 0.95, 0.97]),
        with_accuracy(m("hvd1", "hvd", 1, [9.0, 1.0, 2.0], rep=1), [0.90, 0.94, 0.96]),
        with_accuracy(
            m("hvd2", "hvd", 2, [5.0, 0.6, 0.6], images_per_epoch=2000, processes=2),
            [0.95, 0.97, 0.97],
        ),
        with_accuracy(
            m("hvd2", "hvd", 2, [5.0, 0.6, 0.6], rep=1, images_per_epoch=2000, processes=2),
            [0.96, 0.97, 0.98],
        ),
        # More ranks that never get there: a miss, however fast.
        with_accuracy(
            m("hvd4", "hvd", 4, [2.0, 0.3, 0.3], images_per_epoch=4000, processes=4),
            [0.10, 0.11, 0.11],
        ),
        with_accuracy(
            m("hvd4", "hvd", 4, [2.0, 0.3, 0.3], rep=1, images_per_epoch=4000, processes=4),
            [0.10, 0.11, 0.96],
        ),
    ]
    rows = {r["condition"]: r for r in summary_table(measured, target=0.95)}
    assert rows["hvd1"]["time_to_target_s"] == pytest.approx((15.0 + 17.0) / 2)
    assert rows["hvd1"]["val_accuracy"] == pytest.approx(0.965)
    assert rows["hvd2"]["time_to_target_s"] == pytest.approx(10.0)
    assert rows["hvd2"]["time_to_target_vs_hvd1"] == pytest.approx(10.0 / 16.0)
    assert rows["hvd4"]["time_to_target_s"] is None and rows["hvd4"]["reached_target"] == 1
    assert rows["hvd4"]["images_per_s"] > rows["hvd2"]["images_per_s"]  # fast, and useless
    table = markdown(list(rows.values()), None, anova(measured, {"a": [1, 2], "b": [3, 4]}))
    assert "| hvd4 |" in table and "not reached (1/2)" in table
    assert "| 10.0 ± 0.0 |" in table and "0.62x" in table
    assert "One-way ANOVA on the per-repetition times to val_accuracy 0.95: F = " in table
    # Without a target the columns say n/a.
    plain = summary_table(measured)
    assert plain[0]["time_to_target_s"] is None and plain[0]["target_accuracy"] is None
