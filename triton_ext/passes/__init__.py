"""Our passes over Triton's compiled TTGIR, run through Triton's stage hook (docs/design.md §7).

``install()`` composes a hook into ``triton.knobs.runtime.add_stages_inspection_hook``. Triton
calls it as ``hook(backend, stages, options, language, capability)`` from ``add_stages``, with
``stages`` the ordered dict of stage name -> ``fn(module, metadata)``; ours wraps ``stages["ttgir"]``
so every module that leaves the "ttgir" stage holding a ``ttg.warp_specialize`` goes through
``ws_verifier.verify_ttgir``, and every one holding an FP8 ``ttng.warp_group_dot`` through
``fp8_verifier.verify_fp8`` with ``promote_every=fp8_promote_every`` (a module setting, read at
each compile; 0 unless the kernel is block-scaled). A violation raises ``CompileError`` out of
``triton.compile``.

The hook is not part of Triton's cache key. Callers fold ``cache_key_part()`` (the hook version
and a hash of this package's sources) into their own key; ``install()`` also moves Triton's cache
of the calling process into a subfolder named by it and by ``fp8_promote_every`` (set the setting
first; ``install()`` again after changing it), so a Triton cache hit (which skips every stage, the
hook included) only returns kernels compiled under these very checks.

``checking(promote_every)`` is ``install()`` for the compiles inside a ``with`` block only: the
hook, Triton's cache folder and ``fp8_promote_every`` are put back as they were on leaving, so a
process that compiles our kernels in-process (``triton_ext/gluon/compile.py``) runs the checks on
them and on nothing else it compiles (a user's own Triton kernels keep their cache folder and
never meet our verifiers). Blocks are serialized by a lock: the hook and the cache folder are
Triton's process-wide settings. Importing this package does not import Triton.
"""
from __future__ import annotations

import hashlib
import os
import threading
from contextlib import contextmanager
from pathlib import Path

from .fp8_verifier import has_fp8_dot, verify_fp8
from .ws_verifier import allocate, verify_ttgir

__all__ = ["HOOK_VERSION", "cache_key_part", "install", "checking", "verify_ttgir", "verify_fp8",
           "allocate", "verified", "fp8_promote_every"]

HOOK_VERSION = 2
verified: list[str] = []        # kernels the installed hook verified in this process
fp8_promote_every = 0           # K a block-scaled FP8 kernel covers between promotions (0: none)


def cache_key_part() -> str:
    """The part of a compile cache key that stands for the installed hook."""
    h = hashlib.sha256()
    for name in sorted(p.name for p in Path(__file__).parent.glob("*.py")):
        h.update(name.encode() + b"\0" + Path(__file__).with_name(name).read_bytes())
    return f"tilews-ttgir-passes-v{HOOK_VERSION}-{h.hexdigest()[:16]}"


def _cache_folder() -> str:
    key = cache_key_part()
    return f"{key}-fp8-promote-{fp8_promote_every}" if fp8_promote_every else key


def install(isolate_cache: bool = True) -> None:
    """Register the verifier hook (idempotent; an existing hook keeps running first) and point
    Triton's cache at the folder of the current checks."""
    from triton import knobs
    hook = knobs.runtime.add_stages_inspection_hook
    if getattr(hook, "tilews_key", None) != cache_key_part():
        hook = _register(knobs, hook)
    if isolate_cache:
        knobs.cache.dir = os.path.join(hook.tilews_cache_base, _cache_folder())


_CHECKING = threading.RLock()
_UNSET = object()
_CACHE_VARIABLE = "TRITON_CACHE_DIR"


@contextmanager
def checking(promote_every: int = 0):
    """``install()`` with ``fp8_promote_every = promote_every`` for the compiles inside the block;
    the hook, Triton's cache folder and the setting are restored on leaving."""
    global fp8_promote_every
    from triton import knobs
    with _CHECKING:
        saved = (knobs.runtime.__dict__.get("add_stages_inspection_hook", _UNSET),
                 knobs.cache.__dict__.get("dir", _UNSET), fp8_promote_every,
                 os.environ.get(_CACHE_VARIABLE))
        try:
            fp8_promote_every = promote_every
            install()
            yield
        finally:
            for owner, name, value in ((knobs.runtime, "add_stages_inspection_hook", saved[0]),
                                       (knobs.cache, "dir", saved[1])):
                if value is _UNSET:
                    owner.__dict__.pop(name, None)
                else:
                    setattr(owner, name, value)
            fp8_promote_every = saved[2]
            # setting Triton's cache folder also sets its variable (for child processes)
            if saved[3] is None:
                os.environ.pop(_CACHE_VARIABLE, None)
            else:
                os.environ[_CACHE_VARIABLE] = saved[3]


def _register(knobs, previous):
    """Our hook, wrapping ``previous`` (None or another hook), registered with Triton."""

    def hook(backend, stages, options, language, capability):
        if previous is not None:
            previous(backend, stages, options, language, capability)
        if capability is None or "ttgir" not in stages:     # not CUDA
            return
        make_ttgir = stages["ttgir"]

        def ttgir_then_verify(src, metadata):
            mod = make_ttgir(src, metadata)
            text = mod.str()
            warp_specialized, fp8 = "ttg.warp_specialize" in text, has_fp8_dot(text)
            if not (warp_specialized or fp8):
                return mod
            name = mod.get_entry_func_name()
            if warp_specialized:
                from triton.backends.nvidia.compiler import get_ptx_version_from_options
                verify_ttgir(text, name, capability=capability,
                             ptx_version=get_ptx_version_from_options(options, backend.target.arch))
            if fp8:
                verify_fp8(text, name, promote_every=fp8_promote_every)
            verified.append(name)
            return mod

        stages["ttgir"] = ttgir_then_verify

    hook.tilews_key = cache_key_part()
    hook.tilews_cache_base = knobs.cache.dir
    knobs.runtime.add_stages_inspection_hook = hook
    return hook
