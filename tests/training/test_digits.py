"""The bundled digits read from scikit-learn's folder are load_digits()' own, without its import."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from hvdflow.training.digits import bundled_digits

pytestmark = pytest.mark.unit


def test_the_digits_are_load_digits_own():
    from sklearn.datasets import load_digits

    images, labels = bundled_digits()
    digits = load_digits()
    assert images.shape == (1797, 8, 8) and images.dtype == digits.images.dtype
    np.testing.assert_array_equal(images, digits.images)
    np.testing.assert_array_equal(labels, digits.target)


def test_reading_them_imports_no_scikit_learn():
    code = (
        "import sys; from hvdflow.training.digits import bundled_digits; bundled_digits(); "
        "print('sklearn' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
