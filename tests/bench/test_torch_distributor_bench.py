"""The TorchDistributor benchmark's table: what it reports from the runs it measured."""

from __future__ import annotations

import pytest

from studies.torch_distributor import markdown


def _run(kind: str, first: float, epoch: float) -> dict:
    return {
        "kind": kind,
        "launch_to_first_step_s": first,
        "steady_epoch_s": epoch,
        "total_s": first + 3 * epoch,
        "accuracy": 0.8,
        "threads": 1,
    }


@pytest.mark.unit
def test_the_table_gives_medians_and_ours_over_theirs():
    runs = [_run("hvdflow", 6, 1.5), _run("pyspark", 12, 1.5), _run("hvdflow", 8, 1.7)]
    runs.append(_run("pyspark", 14, 1.3))
    kills = [
        {
            "kind": "hvdflow",
            "kill_to_error_s": 0.2,
            "cancelled_after_timeout": False,
            "error": "RankFailed",
            "first_line": "rank 1 on vm",
            "names_rank_1": True,
            "has_signal": True,
        },
        {
            "kind": "pyspark",
            "kill_to_error_s": 120.0,
            "cancelled_after_timeout": True,
            "error": "Py4JJavaError",
            "first_line": "An error occurred",
            "names_rank_1": False,
            "has_signal": False,
        },
    ]
    table = markdown(runs, kills)
    assert "| launch to the first step, s (median) | 7.000 | 13.000 | 0.54x |" in table
    assert "| steady epoch, s (median of epochs 2+) | 1.600 | 1.400 | 1.14x |" in table
    assert "| 0.2 | 120.0 (cancelled at the timeout) |" in table
    assert "names rank 1: False" in table and "`Py4JJavaError`" in table
