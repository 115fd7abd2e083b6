"""The registered model leaves no AutoGraph source file behind where it predicted."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.integration

# In a fresh process: AutoGraph converts Keras' predict function once per process (its cache is
# keyed by the function's code), so in a worker that predicted before there is nothing to see.
FRESH_PREDICT = """
import os, sys
import numpy as np
from hvdflow.serving.classifier import ImageClassifier, autograph_modules, keras_2

keras = keras_2()
model = ImageClassifier(["a", "b"], (4, 4, 1))
model.network = keras.Sequential(
    [keras.Input((4, 4, 1)), keras.layers.Flatten(), keras.layers.Dense(2)]
)
before = autograph_modules()
model.probabilities(np.zeros((3, 4, 4, 1), np.float32))
made = autograph_modules() - before
files = [getattr(sys.modules[n], k) for n in made for k in ("__file__", "__cached__")]
left = [path for path in files if path and os.path.exists(path)]
# The converted function still runs without its file.
shape = model.probabilities(np.ones((2, 4, 4, 1), np.float32)).shape
print(len(made), len(left), shape[0], shape[1])
"""


def test_predicting_leaves_no_autograph_source_or_bytecode_in_the_temporary_folder():
    """Keras converts its predict function on the first predict and AutoGraph writes it to a file
    it removes only at exit; processes that serve the model seldom get there (pyspark's workers
    end with os._exit), so the model removes the files its predict made: the source, and the
    bytecode Python cached beside it (an executor writes bytecode, unlike the suite's Pythons)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    done = subprocess.run(
        [sys.executable, "-c", FRESH_PREDICT], capture_output=True, text=True, timeout=300, env=env
    )
    assert done.returncode == 0, done.stderr[-3000:]
    made, left, rows, classes = map(int, done.stdout.split()[-4:])
    assert made >= 1  # the predict function, converted in this process
    assert left == 0
    assert (rows, classes) == (2, 2)
