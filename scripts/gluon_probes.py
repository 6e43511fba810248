"""Shared by the hand-written Gluon probes (``probe_attention_gluon.py``, ``probe_fp8_gluon.py``):
a probe kernel's source with its schedule switches as module-level constexprs (Gluon's
``warp_specialize`` passes no constexprs to partitions), written to a file so Triton can read its
source, imported once per set of switches."""
from __future__ import annotations

import importlib.util
import os
import tempfile

HEADER = """from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared, mbarrier, tma, warpgroup_mma, warpgroup_mma_wait)
"""
_MODULES: dict = {}


def probe_module(kernel: str, knobs: dict, prefix: str):
    """The module holding ``kernel`` (source text) with ``knobs`` as constexprs."""
    key = (prefix, kernel, tuple(sorted(knobs.items())))
    if key not in _MODULES:
        text = HEADER + "".join(f"{k}: gl.constexpr = gl.constexpr({v!r})\n" for k, v in knobs.items())
        name = f"{prefix}_{len(_MODULES)}"
        path = os.path.join(tempfile.mkdtemp(prefix=f"{prefix}_"), f"{name}.py")
        with open(path, "w") as fh:
            fh.write(text + "\n\n" + kernel)
        spec = importlib.util.spec_from_file_location(name, path)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        _MODULES[key] = mod
    return _MODULES[key]
