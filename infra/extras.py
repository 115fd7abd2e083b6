"""hvdflow's optional extras: which are installed, and the one-line error when one is missing.

TensorFlow is an extra under either of its names (``hvdflow[tensorflow]``, or
``hvdflow[tensorflow-cpu]`` with 2.15), as in Horovod's own extras. Horovod, Petastorm and
tensorflow-addons belong to the classic profile (Python 3.11, TensorFlow 2.15, pyarrow 14): none
of them installs on the current stack. With TensorFlow, the pipeline, the tf_collective engine,
the pyarrow reader, scoring and the champion need none of them; a feature that does asks here
first and fails at once, before any Spark job or rank starts, saying what to install.
Whether a package is installed is read from the import system's finders without importing it
(Horovod's import costs seconds and loads TensorFlow).
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass


class MissingExtra(ImportError):
    """A feature needs an optional package that is not installed; the message says which."""


@dataclass(frozen=True)
class Extra:
    module: str  # what the code imports
    install: str  # how to get it


TENSORFLOW = Extra(
    "tensorflow",
    "pip install 'hvdflow[tensorflow]' (or 'hvdflow[tensorflow-cpu]', TensorFlow 2.15 without "
    "its GPU kernels)",
)
HOROVOD = Extra(
    "horovod",
    "build Horovod against the installed TensorFlow (it has no wheel on PyPI), then pip "
    "install 'hvdflow[horovod]'; scripts/setup.sh classic does both (Python 3.11, TensorFlow "
    "< 2.19)",
)
PETASTORM = Extra("petastorm", "pip install 'hvdflow[petastorm]' (it needs pyarrow < 15)")
ADDONS = Extra("tensorflow_addons", "pip install 'hvdflow[addons]' (TensorFlow 2.15 only)")
TORCH = Extra(
    "torch",
    "pip install 'hvdflow[torch]' (not beside hvdflow[petastorm]; on a CPU machine, PyTorch's CPU "
    "build: --index-url https://download.pytorch.org/whl/cpu)",
)


def installed(extra: Extra) -> bool:
    try:
        return importlib.util.find_spec(extra.module) is not None
    except ValueError:  # a module object without a spec, left in sys.modules by a test
        return True


def require(extra: Extra, feature: str, instead: str) -> None:
    """Raise MissingExtra unless ``extra`` is installed. ``feature``: what asked for it
    (``engine='horovod'``); ``instead``: what works without it."""
    if not installed(extra):
        raise MissingExtra(
            f"{feature} needs {extra.module}, which is not installed in this Python: "
            f"{extra.install}; or use {instead}"
        )
