"""scikit-learn's bundled 1,797 real 8x8 digits, read from its package folder.

``sklearn.datasets.load_digits`` reads the same file, but importing scikit-learn takes over a
second of CPU. That is paid in every rank of ``hvdflow smoke`` and in every first run on a new
input folder, and only the file is needed, so it is read here without the import.
"""

from __future__ import annotations

import gzip
import importlib.util
from pathlib import Path

import numpy as np

# Where scikit-learn keeps the file, inside its package (sklearn/datasets/_base.py reads it so).
DIGITS_FILE = Path("datasets", "data", "digits.csv.gz")


def bundled_digits() -> tuple[np.ndarray, np.ndarray]:
    """``(images, labels)`` as ``load_digits()`` gives them: float64 images of shape
    (1797, 8, 8) with values 0-16, and int labels. Raises ModuleNotFoundError (name
    ``sklearn``) where scikit-learn is not installed."""
    spec = importlib.util.find_spec("sklearn")  # finds the package without importing it
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError("No module named 'sklearn'", name="sklearn")
    path = Path(next(iter(spec.submodule_search_locations))) / DIGITS_FILE
    with gzip.open(path, "rt") as f:
        data = np.loadtxt(f, delimiter=",")
    return data[:, :-1].reshape(-1, 8, 8), data[:, -1].astype(int)
