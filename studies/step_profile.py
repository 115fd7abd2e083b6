"""Where a training step's time goes: Horovod's two ranks against one plain process, profiled.

One run, side by side: Horovod's two ranks of one thread (the benchmark's hvd2) train the MNIST
CNN on the benchmark's dataset with Horovod's timeline on and TensorFlow's profiler over a
window of their steady second epoch; then one plain Keras process of one thread (keras1, what
each rank would be alone) and one on every core (keras, what the ranks compete with) under the
profiler over the same images. Printed per process: the
profiled steps' wall clock split into ops running, input, waiting inside the step (for the
allreduces) and between steps (``training.tf_profile``), with the heaviest kernels; and hvd2's
steady epoch by the timeline (waiting for the peer, allreduce, the rest: ``bench.timeline``);
last, what each takes for hvd2's step's images (two ranks' batches), and what hvd2's ranks
would take with their ops alone, nothing exchanged.

    .venv/bin/python -m studies.step_profile --dataset DATASET_FOLDER --out DIR

DATASET_FOLDER holds a published dataset's ``manifest.json`` (for ``hvdflow bench``:
``$HVDFLOW_HOME/datasets/<fingerprint>``). DIR receives the profiles (TensorBoard's profile tab
reads them: ``tensorboard --logdir DIR/hvd2/rank0``) and the timeline.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from hvdflow.bench.conditions import measure
from hvdflow.bench.study import STUDY_TRAINING, study_spec
from hvdflow.bench.timeline import breakdown, load_events
from hvdflow.infra import HorovodOptions, HorovodRunner, LaunchOptions
from hvdflow.training.reader import steps_per_epoch
from hvdflow.training.tf_profile import host_events, newest_profile, step_breakdown
from hvdflow.training.trainer import train_classifier

# Steps of two ranks profiled, from this far into the second epoch: 40 x 2 x 128 images.
HVD_STEPS, SKIP = 40, 60


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dataset", required=True, help="a published dataset's folder")
    parser.add_argument("--out", required=True, help="a folder for the profiles and timeline")
    args = parser.parse_args(argv)
    rows = profile_side_by_side(args.dataset, os.path.abspath(args.out))
    for name, shares in rows.items():
        print(f"{name}: {json.dumps(shares)}", flush=True)
    images = 2 * STUDY_TRAINING["batch_size"]
    print(f"per {images} images (ms): {json.dumps(per_hvd2_step(rows))}", flush=True)
    return 0


def per_hvd2_step(rows: dict[str, dict]) -> dict[str, float]:
    """Milliseconds each process takes for the images of one hvd2 step (both ranks' batches):
    hvd2 as measured and with its slower rank's ops alone (no allreduce, no wait), keras1
    twice (the two batches one after the other), keras (every core) twice."""
    ranks = [rows["hvd2 rank 0"], rows["hvd2 rank 1"]]
    return {
        "hvd2": round(max(r["step_ms"] for r in ranks), 1),
        "hvd2 ops alone": round(max(r["step_ms"] * r["ops"] for r in ranks), 1),
        "keras1": round(2 * rows["keras1"]["step_ms"], 1),
        "keras": round(2 * rows["keras"]["step_ms"], 1),
    }


def profile_side_by_side(dataset: str, out: str) -> dict[str, dict]:
    """hvd2 (both ranks, and its timeline), keras1 and keras, profiled over the same images."""
    spec = study_spec(dataset, epochs=2)
    rows = spec.data.train_rows
    hvd = steps_per_epoch(rows, 2, spec.batch_size)
    os.makedirs(out, exist_ok=True)  # Horovod writes its timeline into an existing folder only
    timeline = os.path.join(out, "hvd2_timeline.json")
    result = HorovodRunner(
        np=2, options=LaunchOptions(horovod=HorovodOptions(timeline_path=timeline))
    ).run(
        train_classifier,
        spec=spec.replace(
            profile_dir=f"{out}/hvd2", profile_batches=(hvd + SKIP, hvd + SKIP + HVD_STEPS)
        ),
    )
    # One process takes twice the steps for the same images.
    one = steps_per_epoch(rows, 1, spec.batch_size)
    for condition in ("keras1", "keras"):
        plain = spec.replace(
            profile_dir=f"{out}/{condition}",
            profile_batches=(one + 2 * SKIP, one + 2 * (SKIP + HVD_STEPS)),
        )
        measure(condition, 0, {"spec": plain})
    return {
        "hvd2 rank 0": step_breakdown(host_events(newest_profile(f"{out}/hvd2/rank0"))),
        "hvd2 rank 1": step_breakdown(host_events(newest_profile(f"{out}/hvd2/rank1"))),
        "keras1": step_breakdown(host_events(newest_profile(f"{out}/keras1/rank0"))),
        "keras": step_breakdown(host_events(newest_profile(f"{out}/keras/rank0"))),
        "hvd2 timeline (rank 0, steady epoch)": breakdown(
            load_events(timeline), skip_first_s=result.epoch_times[0]
        ),
    }


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
