"""Emitted source as an importable Python module.

Triton reads a kernel's source with ``inspect``, so the source must live in a real file: the
artifact store writes it (content-addressed) and it is imported under a module name unique to
its contents. Shared by the ``tl`` and Gluon launchers.
"""
from __future__ import annotations

import importlib.util
from types import ModuleType

from tilews.lowering.backend import ArtifactStore


def load_module(store: ArtifactStore, source: str, prefix: str) -> ModuleType:
    path = store.source_file(source)
    spec = importlib.util.spec_from_file_location(f"{prefix}_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
