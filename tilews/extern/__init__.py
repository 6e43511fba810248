"""``tilews.extern``: device functions written in the tile language, for ``T.call_extern``.

TileLang's kernels call CUDA functions spliced in as source (``T.import_source(src)`` then
``T.call_extern(name, T.access_ptr(buf, "r"), ...)``). tilews compiles through Triton and Metal,
so it calls an implementation registered under the name instead::

    @T.macro
    def decode_u8_to_f32(src, dst, n):        # src, dst: T.access_ptr pointers; n: an int
        for k in T.vectorized(n):
            dst[k] = T.cast(src[k], T.float32)

    tilews.extern.register_extern("decode_u8_to_f32", decode_u8_to_f32)

The implementation runs where the call stands, in the caller's thread: per-thread code in it is
per-thread code of the kernel. A pointer ``p`` from ``T.access_ptr`` indexes like a 1-d buffer
from its start (``p[k]``, also as a store target); ``p.dtype`` is its element type.

tilews ships the function families of TileLang's dequantizing examples, written from what each
computes: ``lop3`` (BitBLAS's int4/int2/int1 -> float16 decoders of the interleaved layout
``interleave_weight`` produces, with scales and zeros) and ``mxfp`` (the fp4 -> bfloat16
"twiddling" decoder).
"""
from __future__ import annotations

from typing import Any, Callable, Iterable

from tilews.lowering.frontend import extern as _registry


def register_extern(name: str, implementation: Callable[..., Any],
                    signature: Iterable[str] = ()) -> None:
    """Bind ``T.call_extern(name, ...)`` to ``implementation`` (a ``@T.macro``, or a function
    called at build time with the call's arguments); a later registration of the name replaces
    it. Where a kernel imports source (``T.import_source``) that defines ``name``, that source
    must contain each string of ``signature`` (e.g. the family's core function), a cheap check
    that the imported function is the one ``implementation`` computes."""
    _registry.register(name, implementation, tuple(signature))


def registered(name: str) -> bool:
    """Whether ``T.call_extern(name, ...)`` has an implementation."""
    return _registry.registered(name) is not None


from . import lop3, mxfp  # noqa: E402  (the shipped implementations register themselves)

__all__ = ["register_extern", "registered", "lop3", "mxfp"]
