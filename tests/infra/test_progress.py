"""Progress lines: what they say, and that a long step gets one line per update, not a flood."""

from __future__ import annotations

import threading

import pytest

from hvdflow.infra.progress import ByteProgress, bytes_line, human_bytes, tasks_line
from hvdflow.infra.spark import StageProgress

MiB = 1024 * 1024


@pytest.mark.unit
@pytest.mark.parametrize(
    ("n", "shown"),
    [
        (0, "0 B"),
        (1023, "1023 B"),
        (1024, "1.0 KiB"),
        (1536 * MiB, "1.5 GiB"),
        (3 * 1024**4, "3.0 TiB"),
    ],
)
def test_bytes_are_shown_in_binary_units(n, shown):
    assert human_bytes(n) == shown


@pytest.mark.unit
def test_a_bytes_line_has_the_count_the_share_the_rate_and_the_time_left():
    assert bytes_line("uploading vgg16 weights", 120 * MiB, 500 * MiB, 4.0) == (
        "uploading vgg16 weights: 120.0 MiB of 500.0 MiB (24%), 30.0 MiB/s, about 13 s left"
    )
    assert bytes_line("downloading x", 3 * MiB, None, 2.0) == "downloading x: 3.0 MiB, 1.5 MiB/s"


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


@pytest.mark.unit
def test_a_transfer_logs_at_most_one_line_every_few_seconds_then_its_total():
    clock, lines = Clock(), []
    progress = ByteProgress("uploading w", 100 * MiB, lines.append, every_s=5, clock=clock)
    for _ in range(50):  # 50 chunks of 1 MiB, one every 0.2 s: 10 s in all
        clock.now += 0.2
        progress(MiB)
    progress.finish()
    assert lines == [
        "uploading w: 25.0 MiB of 100.0 MiB (25%), 5.0 MiB/s, about 15 s left",
        "uploading w: 50.0 MiB of 100.0 MiB (50%), 5.0 MiB/s, about 10 s left",
        "uploading w: done, 50.0 MiB in 10.0 s (5.0 MiB/s)",
    ]


@pytest.mark.unit
def test_a_transfer_counted_from_several_threads_loses_no_byte():
    progress = ByteProgress("x", None, lambda line: None, every_s=0)
    threads = [
        threading.Thread(target=lambda: [progress(1) for _ in range(10_000)]) for _ in range(4)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert progress.done == 40_000


@pytest.mark.unit
def test_a_spark_stage_is_reported_when_seen_when_it_moves_and_once_when_it_is_gone():
    stages = StageProgress()
    save = "save at job.py:10"
    assert stages.update([(3, save, 0, 40, 2)], now=0.0) == [
        "Spark stage 3 (save at job.py:10): 0/40 tasks done (0%), 2 running"
    ]
    assert stages.update([(3, save, 10, 40, 2)], now=5.0) == [tasks_line(3, save, 10, 40, 2, 2.0)]
    assert stages.update([(3, save, 10, 40, 2)], now=10.0) == []  # no move: no line
    assert stages.update([(3, save, 30, 40, 2)], now=15.0) == [
        "Spark stage 3 (save at job.py:10): 30/40 tasks done (75%), 2 running, 2.00 tasks/s"
    ]
    assert stages.update([], now=20.0) == [
        "Spark stage 3 (save at job.py:10): no longer running (40 tasks; seen for 20 s)"
    ]
    assert stages.update([], now=25.0) == []
