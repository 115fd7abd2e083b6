"""How far a training is, from its ranks' epoch lines."""

from __future__ import annotations

import pytest

from hvdflow.tasks.train.progress import EpochProgress
from hvdflow.training.epoch_log import epoch_done_line, epoch_started_line


@pytest.mark.unit
def test_the_percentage_follows_the_epoch_lines_and_never_goes_back():
    progress = EpochProgress()
    assert progress.description() == "waiting for the first epoch"
    seen = []
    lines = [
        epoch_started_line(1, 4),
        "12/45 [=====>.......] - loss: 0.9",  # Keras' own progress: not an epoch line
        epoch_done_line(1, 4, 1.5, {"loss": 0.5}),
        epoch_done_line(1, 4, 1.5, {"loss": 0.5}),  # rank 1 says the same
        epoch_started_line(2, 4),
        epoch_done_line(2, 4, 1.0, {}),
        epoch_started_line(2, 4),  # a retry resuming from its checkpoint
        epoch_done_line(3, 4, 1.0, {}),
    ]
    for line in lines:
        if progress.see(line):
            seen.append((progress.percent, progress.description()))
    assert seen == [
        (25.0, "1 of 4 epochs done"),
        (50.0, "2 of 4 epochs done"),
        (75.0, "3 of 4 epochs done"),
    ]
