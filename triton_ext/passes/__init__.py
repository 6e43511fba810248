"""Our passes over Triton's compiled TTGIR, run through Triton's stage hook (docs/design.md §7).

``install()`` composes a hook into ``triton.knobs.runtime.add_stages_inspection_hook``. Triton
calls it as ``hook(backend, stages, options, language, capability)`` from ``add_stages``, with
``stages`` the ordered dict of stage name -> ``fn(module, metadata)``; ours wraps ``stages["ttgir"]``
so every module that leaves the "ttgir" stage holding a ``ttg.warp_specialize`` goes through
``ws_verifier.verify_ttgir`` (a violation raises ``CompileError`` out of ``triton.compile``).

The hook is not part of Triton's cache key. Callers fold ``cache_key_part()`` (the hook version
and a hash of this package's sources) into their own key; ``install()`` also moves Triton's cache
of the calling process into a subfolder named by it, so a Triton cache hit (which skips every
stage, the hook included) only returns kernels compiled under this very verifier. Meant for a
compile process of its own (``triton_ext/gluon/compile.py``). Importing this package does not
import Triton.
"""
from __future__ import annotations

import hashlib
import os
from pathlib import Path

from .ws_verifier import allocate, verify_ttgir

__all__ = ["HOOK_VERSION", "cache_key_part", "install", "verify_ttgir", "allocate", "verified"]

HOOK_VERSION = 1
verified: list[str] = []        # kernels the installed hook verified in this process


def cache_key_part() -> str:
    """The part of a compile cache key that stands for the installed hook."""
    h = hashlib.sha256()
    for name in sorted(p.name for p in Path(__file__).parent.glob("*.py")):
        h.update(name.encode() + b"\0" + Path(__file__).with_name(name).read_bytes())
    return f"tilews-ttgir-passes-v{HOOK_VERSION}-{h.hexdigest()[:16]}"


def install(isolate_cache: bool = True) -> None:
    """Register the verifier hook (idempotent; an existing hook keeps running first)."""
    from triton import knobs
    key = cache_key_part()
    previous = knobs.runtime.add_stages_inspection_hook
    if getattr(previous, "tilews_key", None) == key:
        return

    def hook(backend, stages, options, language, capability):
        if previous is not None:
            previous(backend, stages, options, language, capability)
        if capability is None or "ttgir" not in stages:     # not CUDA
            return
        make_ttgir = stages["ttgir"]

        def ttgir_then_verify(src, metadata):
            mod = make_ttgir(src, metadata)
            text = mod.str()
            if "ttg.warp_specialize" in text:
                from triton.backends.nvidia.compiler import get_ptx_version_from_options
                name = mod.get_entry_func_name()
                verify_ttgir(text, name, capability=capability,
                             ptx_version=get_ptx_version_from_options(options, backend.target.arch))
                verified.append(name)
            return mod

        stages["ttgir"] = ttgir_then_verify

    hook.tilews_key = key
    knobs.runtime.add_stages_inspection_hook = hook
    if isolate_cache:
        knobs.cache.dir = os.path.join(knobs.cache.dir, key)
