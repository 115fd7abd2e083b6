"""Patching a module when something first imports it, not importing it to patch it: a rank
wraps TensorFlow's, torch's and Horovod's entry points without paying for their import where
``main`` never loads them (TensorFlow's import takes seconds of CPU)."""

from __future__ import annotations

import importlib.abc
import importlib.util
import sys


class _ThenPatch(importlib.abc.Loader):
    """A module's own loader, followed by ``patch(module)`` once the module has run."""

    def __init__(self, loader, patch):
        self._loader, self._patch = loader, patch

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module) -> None:
        self._loader.exec_module(module)
        self._patch(module)

    def __getattr__(self, name):  # get_source and the rest: tracebacks still show the lines
        return getattr(self._loader, name)


class _PatchOnImport(importlib.abc.MetaPathFinder):
    """Patch a module when something first imports it, instead of importing it to patch it."""

    def __init__(self, name: str, patch):
        self._name, self._patch = name, patch

    def find_spec(self, fullname, path, target=None):
        if fullname != self._name:
            return None
        sys.meta_path.remove(self)  # once; and the other finders find the real module
        spec = importlib.util.find_spec(fullname)
        if spec is not None and spec.loader is not None:
            spec.loader = _ThenPatch(spec.loader, self._patch)
        return spec


def patch_on_import(name: str, patch) -> None:
    """``patch(module)`` now if ``name`` is loaded, else when something first imports it."""
    if name in sys.modules:
        patch(sys.modules[name])
    else:
        sys.meta_path.insert(0, _PatchOnImport(name, patch))
