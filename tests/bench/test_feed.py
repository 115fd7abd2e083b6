"""``hvdflow bench-input`` (``hvdflow.bench.feed``): MLPerf Storage's accelerator utilisation
with an emulated accelerator, on streams whose speed the tests set, and on a real dataset."""

from __future__ import annotations

import json
import threading
import time

import numpy as np
import pytest

from hvdflow.bench import feed
from hvdflow.flows.cli import main


class Clock:
    """Time that passes only when a test says: the emulation's arithmetic, not this machine's."""

    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def batches(self, seconds: float, first: float, rows: int = 4):
        """Batches of ``rows`` labels, each ready ``seconds`` after asked for (the first after
        ``first``)."""
        self.now += first
        yield np.zeros((rows, 2)), np.zeros(rows)
        while True:
            self.now += seconds
            yield np.zeros((rows, 2)), np.zeros(rows)

    def step(self, seconds: float):
        def step(batch):
            self.now += seconds

        return step


@pytest.mark.unit
def test_au_is_compute_over_wall_time_with_the_first_steps_wait_left_out():
    device = feed.accelerator(None, step_ms=10, batch=4)
    clock = Clock()
    run = {"steps": 5, "clock": clock, "step": clock.step(0.01)}
    slow = feed.emulate(clock.batches(0.03, first=0.5), device, epochs=2, **run)
    assert [(f.epoch, f.images) for f in slow] == [(1, 20), (2, 20)]
    # 10 ms of compute a step for 30 ms of waiting: AU 1/4; the first epoch's first wait (the
    # 0.5 s start) is not counted, its step is.
    assert [f.au for f in slow] == pytest.approx([0.05 / (0.05 + 0.12), 0.25])
    assert slow[0].wait_s == pytest.approx(4 * 0.03) and slow[1].wait_s == pytest.approx(0.15)
    assert slow[1].images_per_s == pytest.approx(20 / 0.2)
    ready = feed.emulate(clock.batches(0.0, first=0.5), device, epochs=1, **run)
    assert ready[0].au == 1.0


@pytest.mark.unit
def test_presets_name_their_source_scale_with_the_batch_and_an_unknown_one_names_them_all():
    vgg = feed.accelerator("vgg16-h200-bf16")
    assert vgg.batch == 128 and vgg.step_s == pytest.approx(0.0661, abs=1e-4)
    assert "gpu.md" in vgg.source
    assert feed.accelerator("vgg16-h200-bf16", batch=64).step_s == pytest.approx(vgg.step_s / 2)
    with pytest.raises(ValueError, match="vgg16-h200-bf16, vgg16-h200-fp32, .*--step-ms") as e:
        feed.accelerator("vgg16-b200")
    assert "\n" not in str(e.value)
    with pytest.raises(ValueError, match="above 0"):
        feed.accelerator(None, step_ms=0)


@pytest.mark.unit
def test_one_core_keeps_as_many_devices_as_its_images_cover_at_90_percent():
    device = feed.Accelerator("d", step_s=0.1, batch=100, source="")  # eats 1,000 images/s
    # 0.1 ms of CPU per image: a core reads 10,000 images/s, 900 of which one device eats at 90%.
    assert feed.kept_at_goal(1e-4, device) == pytest.approx(10_000 / 900)
    assert feed.kept_at_goal(1e-4, device, cores=16) == pytest.approx(16 * 10_000 / 900)


@pytest.mark.unit
def test_read_ahead_raises_the_readers_error_and_stops_its_thread_when_closed():
    def failing():
        yield 1
        raise OSError("the bucket went away")

    ahead = feed.read_ahead(failing())
    assert next(ahead) == 1
    with pytest.raises(OSError, match="bucket went away"):
        next(ahead)

    def endless():
        while True:
            yield 0

    before = threading.active_count()
    ahead = feed.read_ahead(endless())
    next(ahead)
    ahead.close()
    deadline = time.monotonic() + 5
    while threading.active_count() > before and time.monotonic() < deadline:
        time.sleep(0.05)
    assert threading.active_count() == before


@pytest.mark.unit
def test_a_folder_that_is_not_a_preprocessed_dataset_fails_in_one_line_naming_what_it_holds(
    tmp_path, capsys
):
    (tmp_path / "cat.jpg").write_bytes(b"x")
    assert main(["bench-input", str(tmp_path), "--step-ms", "1"]) == 2
    error = capsys.readouterr().err.strip()
    assert "is not a preprocessed dataset" in error and "cat.jpg" in error, error
    assert "\n" not in error
    assert main(["bench-input", str(tmp_path), "--preset", "tpu-v9"]) == 2
    assert "preset 'tpu-v9' does not exist" in capsys.readouterr().err


@pytest.mark.integration
@pytest.mark.current
@pytest.mark.parametrize("feed_name", ["numpy", "tf.data"])
def test_ranks_read_a_preprocessed_dataset_against_the_emulated_device(
    digits_dataset, feed_name, tmp_path, capfd
):
    out = tmp_path / "feed.json"
    version = digits_dataset.path.rsplit("/", 1)[0]  # the folder holding manifest.json
    np_ = "2" if feed_name == "numpy" else "1"  # two ranks: processes started afresh
    args = ["--step-ms", "2", "--batch-size", "64", "--epochs", "2", "--np", np_]
    code = main(["bench-input", version, "--feed", feed_name, *args, "--out", str(out)])
    printed = capfd.readouterr().out  # the ranks' lines too, from their processes
    assert code == 0, printed
    epochs = json.loads(out.read_text())["epochs"]
    assert sorted((e["rank"], e["epoch"]) for e in epochs) == [
        (r, e) for r in range(int(np_)) for e in (1, 2)
    ]
    assert all(e["images"] > 0 and e["images"] % 64 == 0 and 0 < e["au"] <= 1 for e in epochs)
    assert sum(e["images"] for e in epochs) <= 2 * digits_dataset.train_rows
    assert "| rank | epochs |" in printed and "per core at 90% AU" in printed
    assert "rank 0 epoch 2: AU" in printed
