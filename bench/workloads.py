"""An MNIST-sized workload made offline: the bundled real digits, augmented to 60,000 images.

The paper timed MNIST's 60,000 training images of 28x28 at batch 128. Nothing can be
downloaded here, so when the user gives no MNIST IDX files the study makes a stand-in of the
same size and shape from scikit-learn's 1,797 real 8x8 digits: each one scaled to 20x20 and
centred in 28x28 as MNIST's are, then shifted by up to 3 pixels, rotated by up to 12 degrees and
given a little noise, with a fixed seed, so that every run trains on the same images. It is
written as MNIST's own IDX files and preprocessed like them; the tables say which data they ran
on.
"""

from __future__ import annotations

import os
import struct
from pathlib import Path

import numpy as np

from hvdflow.training.digits import bundled_digits

SIDE, DIGIT_SIDE, MAX_SHIFT, MAX_DEGREES, NOISE = 28, 20, 3, 12.0, 12.0
IMAGES_FILE, LABELS_FILE = "train-images-idx3-ubyte", "train-labels-idx1-ubyte"


def total_for_training(train_images: int, val_fraction: float) -> int:
    """How many images to make so that ``train_images`` remain after the validation split."""
    return int(np.ceil(train_images / (1.0 - val_fraction)))


def augmented_digits(count: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """``count`` uint8 images (count, 28, 28) and their labels, the same for the same seed."""
    from PIL import Image

    images, labels = bundled_digits()
    rng = np.random.default_rng(seed)
    picks = rng.integers(0, len(images), count)
    shifts = rng.integers(-MAX_SHIFT, MAX_SHIFT + 1, (count, 2))
    angles = rng.uniform(-MAX_DEGREES, MAX_DEGREES, count)
    # Each source digit scaled once: 0..16 to 0..255, 8x8 to 20x20.
    scaled = [
        Image.fromarray((image * (255 / 16)).astype(np.uint8)).resize(
            (DIGIT_SIDE, DIGIT_SIDE), Image.BILINEAR
        )
        for image in images
    ]
    images = np.zeros((count, SIDE, SIDE), np.uint8)
    margin = (SIDE - DIGIT_SIDE) // 2
    for i, (pick, (dy, dx), angle) in enumerate(zip(picks, shifts, angles, strict=True)):
        canvas = Image.new("L", (SIDE, SIDE))
        canvas.paste(scaled[pick], (margin + int(dx), margin + int(dy)))
        images[i] = np.asarray(canvas.rotate(float(angle), Image.BILINEAR))
    noisy = images.astype(np.float32) + rng.normal(0.0, NOISE, images.shape)
    return np.clip(noisy, 0, 255).astype(np.uint8), labels[picks].astype(np.uint8)


def write_idx(root: str, images: np.ndarray, labels: np.ndarray) -> None:
    """MNIST's IDX format: a big-endian header, then the raw bytes."""
    os.makedirs(root, exist_ok=True)
    count, rows, cols = images.shape
    with open(os.path.join(root, IMAGES_FILE + ".part"), "wb") as f:
        f.write(struct.pack(">IIII", 0x00000803, count, rows, cols))
        f.write(images.tobytes())
    with open(os.path.join(root, LABELS_FILE + ".part"), "wb") as f:
        f.write(struct.pack(">II", 0x00000801, count))
        f.write(labels.tobytes())
    for name in (LABELS_FILE, IMAGES_FILE):  # images last: their presence means done
        os.replace(os.path.join(root, name + ".part"), os.path.join(root, name))


def write_augmented_digits_idx(
    root: str, train_images: int = 60_000, val_fraction: float = 0.0, seed: int = 0
) -> str:
    """The workload's IDX files in ``root`` (made once; kept for the next study)."""
    count = total_for_training(train_images, val_fraction)
    images_path = Path(root) / IMAGES_FILE
    if images_path.exists() and _idx_count(images_path) == count:
        return root
    images, labels = augmented_digits(count, seed)
    write_idx(root, images, labels)
    return root


def _idx_count(path: Path) -> int:
    with open(path, "rb") as f:
        return struct.unpack(">II", f.read(8))[1]
