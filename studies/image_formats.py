"""What the stored image format costs a rank: bytes per image and images decoded per CPU-second.

    .venv/bin/python -m studies.image_formats [--rounds 5] [--photos 200]

PNG (what hvdflow stores), JPEG at quality 95 and raw uint8 pixels, on the bundled digits at
28x28x1 and Caltech101-like photos at 224x224x3; one thread, best of the rounds.
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np

from studies.preprocess_throughput import make_caltech_like

FORMATS = ("png", "jpeg", "raw")
JPEG_QUALITY = 95
# A GPU rank's appetite for 224x224x3 images (docs/benchmarks/gpu.md): low and high.
GPU_IMAGES_PER_S = (800, 1900)


def digits() -> list[np.ndarray]:
    """The bundled digits, 28x28 grey, as preprocessing makes them."""
    import cv2  # noqa: TID253
    from sklearn.datasets import load_digits  # noqa: TID253 (the bundled real digits)

    images = (load_digits().images * (255.0 / 16.0)).astype(np.uint8)
    return [cv2.resize(image, (28, 28), interpolation=cv2.INTER_AREA) for image in images]


def photos(count: int) -> list[np.ndarray]:
    """Caltech101-like photos fitted to 224x224 RGB, as preprocessing makes them."""
    from hvdflow.serving.images import decode  # noqa: PLC0415

    workdir = Path(tempfile.mkdtemp(prefix="hvdflow-bench-formats-"))
    try:
        make_caltech_like(workdir, count, classes=10)
        return [decode(p.read_bytes(), (224, 224), "RGB") for p in sorted(workdir.rglob("*.jpg"))]
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def encoder(fmt: str):
    import cv2  # noqa: TID253

    if fmt == "png":
        return lambda image: cv2.imencode(".png", image)[1].tobytes()
    if fmt == "jpeg":
        return lambda image: cv2.imencode(".jpg", image, [cv2.IMWRITE_JPEG_QUALITY, JPEG_QUALITY])[
            1
        ].tobytes()
    return lambda image: image.tobytes()


def decoder(fmt: str, shape: tuple[int, ...]):
    import cv2  # noqa: TID253

    if fmt == "raw":
        return lambda data: np.frombuffer(data, dtype=np.uint8).reshape(shape)
    return lambda data: cv2.imdecode(np.frombuffer(data, dtype=np.uint8), cv2.IMREAD_UNCHANGED)


def per_cpu_second(decode, blobs: list[bytes]) -> float:
    started = time.process_time()
    for blob in blobs:
        decode(blob)
    return len(blobs) / max(time.process_time() - started, 1e-9)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--photos", type=int, default=200, help="224x224x3 images to make")
    args = parser.parse_args(argv)
    import cv2  # noqa: TID253

    cv2.setNumThreads(1)
    sets = {"28x28x1": digits(), "224x224x3": photos(args.photos)}
    print(f"image formats, one thread, best of {args.rounds} rounds:")
    print(f"  {'images':<10} {'format':<6} {'bytes/image':>12} {'decoded/CPU-s':>14} {'x png':>7}")
    for name, images in sets.items():
        shape = images[0].shape
        rates = {}
        for fmt in FORMATS:
            blobs = [encoder(fmt)(image) for image in images]
            decode = decoder(fmt, shape)
            if fmt != "jpeg":  # lossless: the pixels come back exactly
                assert all(np.array_equal(decode(b), i) for b, i in zip(blobs, images, strict=True))
            rates[fmt] = max(per_cpu_second(decode, blobs) for _ in range(args.rounds))
            size = sum(len(b) for b in blobs) / len(blobs)
            print(
                f"  {name:<10} {fmt:<6} {size:12,.0f} {rates[fmt]:14,.0f} "
                f"{rates[fmt] / rates['png']:7.1f}"
            )
        if name == "224x224x3":
            low, high = GPU_IMAGES_PER_S
            for fmt in FORMATS:
                print(
                    f"  cores to decode for one GPU rank ({low}-{high} img/s), {fmt}: "
                    f"{low / rates[fmt]:.2f}-{high / rates[fmt]:.2f}"
                )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
