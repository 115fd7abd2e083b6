"""Does decoding images get slower once TensorFlow has run in the process? Both profiles.

The reader of a rank decodes its 224x224x3 PNG rows (``training.parquet_reader``: OpenCV where
it is installed) in the process where TensorFlow trains. One process per profile and round
decodes the same in-memory PNGs on one thread, phase after phase: before TensorFlow is imported,
after the import, right after a few Keras training steps, and one second later. For each phase:
images/s, and the CPU that the process's *other* threads used while this one decoded
(``process_time`` less ``thread_time``): TensorFlow's pool threads spinning would show there.

    .venv/bin/python -m studies.reader_after_tf --rounds 2
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import cv2  # noqa: TID253 (what the reader decodes with)
import numpy as np

ROOT = Path(__file__).resolve().parent.parent
PROFILES = {
    "classic": ROOT / ".venv" / "bin" / "python",
    "current": ROOT / ".venv-current" / "bin" / "python",
}
PHASES = ["before_import", "after_import", "right_after_training", "one_second_later"]


def _images(count: int, side: int = 224) -> list[bytes]:
    """PNGs like a photo's: smooth gradients with some noise (pure noise would not compress)."""
    rng = np.random.default_rng(0)
    y, x = np.mgrid[0:side, 0:side]
    encoded = []
    for i in range(count):
        base = np.stack([(x + i) % 256, (y * 2 + i) % 256, (x + y) % 256], axis=-1)
        pixels = np.clip(base + rng.normal(0, 8, base.shape), 0, 255).astype(np.uint8)
        ok, png = cv2.imencode(".png", pixels)
        assert ok
        encoded.append(png.tobytes())
    return encoded


def _decode_all(pngs: list[bytes], repeats: int) -> dict:
    """Decode every PNG ``repeats`` times on this thread, as the reader does; images/s and the
    other threads' CPU over the same wall time."""
    wall, cpu, own = time.perf_counter(), time.process_time(), time.thread_time()
    for _ in range(repeats):
        for png in pngs:
            pixels = cv2.imdecode(np.frombuffer(png, dtype=np.uint8), cv2.IMREAD_UNCHANGED)
            cv2.cvtColor(pixels, cv2.COLOR_BGR2RGB)
    wall = time.perf_counter() - wall
    others = (time.process_time() - cpu) - (time.thread_time() - own)
    return {"images_per_s": len(pngs) * repeats / wall, "others_cpu_share": others / wall}


def _train_a_little() -> None:
    """A few Keras steps of a small CNN: TensorFlow's thread pools created and busy."""
    import tensorflow as tf  # noqa: PLC0415 (the phases before it must not have it)

    model = tf.keras.Sequential(
        [
            tf.keras.Input((64, 64, 3)),
            tf.keras.layers.Conv2D(16, 3, activation="relu"),
            tf.keras.layers.GlobalAveragePooling2D(),
            tf.keras.layers.Dense(10),
        ]
    )
    model.compile("adam", tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    x = np.random.default_rng(0).random((512, 64, 64, 3), dtype=np.float32)
    model.fit(x, np.zeros(512, np.int64), batch_size=64, epochs=2, verbose=0)


def child(images: int, repeats: int) -> dict:
    cv2.setNumThreads(1)  # the reader's decode runs on its own thread; keep OpenCV's pool out
    pngs = _images(images)
    out = {"opencv": cv2.__version__}
    out["before_import"] = _decode_all(pngs, repeats)
    import tensorflow as tf  # noqa: PLC0415 (the first phase runs without it)

    out["tensorflow"] = tf.__version__
    out["after_import"] = _decode_all(pngs, repeats)
    _train_a_little()
    out["right_after_training"] = _decode_all(pngs, repeats)
    time.sleep(1.0)
    out["one_second_later"] = _decode_all(pngs, repeats)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--images", type=int, default=100)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(child(args.images, args.repeats)))
        return 0
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
    # The current profile's tf.keras is Keras 3 unless told otherwise; hvdflow trains on
    # tf-keras there. TensorFlow 2.15 has no tf-keras to switch to.
    legacy = {"classic": {}, "current": {"TF_USE_LEGACY_KERAS": "1"}}
    seen: dict[str, list[dict]] = {name: [] for name in PROFILES}
    for round_ in range(args.rounds):
        order = list(PROFILES) if round_ % 2 == 0 else list(reversed(PROFILES))
        for profile in order:
            command = [str(PROFILES[profile]), "-m", "studies.reader_after_tf", "--child"]
            command += ["--images", str(args.images), "--repeats", str(args.repeats)]
            done = subprocess.run(
                command, cwd=ROOT, env=env | legacy[profile], check=True, capture_output=True
            )
            result = json.loads(done.stdout.decode().strip().splitlines()[-1])
            seen[profile].append(result)
            print(json.dumps({"round": round_ + 1, "profile": profile, **result}), flush=True)
    print(f"\n224x224x3 PNGs decoded on one thread, images/s (others' CPU), {args.rounds} rounds")
    for profile, results in seen.items():
        versions = f"TF {results[0]['tensorflow']}, OpenCV {results[0]['opencv']}"
        cells = []
        for phase in PHASES:
            rate = statistics.median(r[phase]["images_per_s"] for r in results)
            share = max(0.0, statistics.median(r[phase]["others_cpu_share"] for r in results))
            cells.append(f"{phase} {rate:7.1f} ({share:.2f})")
        print(f"  {profile} ({versions}): " + "; ".join(cells))
    return 0


if __name__ == "__main__":
    sys.exit(main())
