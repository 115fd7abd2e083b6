import pytest

from hvdflow import LogLine
from hvdflow.training.epoch_log import epoch_times_from_log, evaluation_line, evaluations


def line(t, text, rank=0):
    return LogLine(t, rank, "stdout", text)


@pytest.mark.unit
def test_epoch_time_is_the_gap_between_first_epoch_lines_of_any_rank():
    lines = [
        line(10.0, "Epoch 1/3"),
        line(10.5, "Epoch 1/3", rank=1),  # later duplicates do not move the start
        line(14.0, "Epoch 1/3 done in 4.0s"),
        line(14.2, "Epoch 2/3", rank=1),
        line(14.3, "Epoch 2/3"),
        line(17.2, "Epoch 3/3"),
        line(20.0, "Epoch 3/3 done in 2.8s"),
    ]
    times = epoch_times_from_log(reversed(lines))  # order of arrival does not matter
    assert [round(t, 3) for t in times] == [4.2, 3.0, 2.8]


@pytest.mark.unit
def test_a_log_without_an_end_for_the_last_epoch_gives_the_complete_ones():
    lines = [line(0.0, "Epoch 1/2"), line(5.0, "Epoch 2/2")]
    assert epoch_times_from_log(lines) == [5.0]
    assert epoch_times_from_log([line(0.0, "no epochs here")]) == []


@pytest.mark.unit
def test_evaluation_lines_read_back_once_per_step_at_their_first_arrival():
    written = [
        line(3.0, evaluation_line(47, 6016, 0.52149, 1024, 0.61)),
        line(3.5, evaluation_line(47, 6016, 0.52149, 1024, 0.61), rank=1),  # a repeat
        line(2.0, "Epoch 1/2"),
        line(9.0, evaluation_line(94, 12032, 0.9712, 1024, 0.5)),
    ]
    assert evaluations(reversed(written)) == [(3.0, 6016, 0.5215, 0.61), (9.0, 12032, 0.9712, 0.5)]
    # Not an epoch line: the paper's method does not see it.
    assert epoch_times_from_log([line(0.0, written[0].text)]) == []
