"""What the shipped decoders share: argument checks and bit fields of packed bytes."""
from __future__ import annotations

from tilews.lowering.frontend import Macro, semantic
from tilews.lowering.frontend.extern import AccessPtr


def library_macro(fn):
    """A shipped implementation: what it builds cites the user's ``T.call_extern`` line."""
    return Macro(fn, cite_caller=True)


def pointer(name: str, what: str, p, dtype=None) -> AccessPtr:
    """``p``, checked to be a ``T.access_ptr`` pointer (of ``dtype`` when given)."""
    if not isinstance(p, AccessPtr):
        raise semantic.err(f"{name}: {what} must be a T.access_ptr(...) pointer, got {p!r}")
    if dtype is not None and p.dtype != dtype:
        raise semantic.err(f"{name}: {what} points at {p.dtype}, but the function reads or "
                           f"writes {dtype} there ('{p.name}')")
    return p


def count(name: str, n, most: int, multiple: int = 1) -> int:
    """The element (or group) count argument: a build-time int in [multiple, most]."""
    if not isinstance(n, int) or isinstance(n, bool) or not multiple <= n <= most \
            or n % multiple:
        raise semantic.err(f"{name}: N must be a build-time int from {multiple} to {most}"
                           f"{f' and a multiple of {multiple}' if multiple > 1 else ''}, got {n!r}")
    return n


def bits(src: AccessPtr, at: int, width: int):
    """The ``width``-bit unsigned field at bit ``at`` of the little-endian bytes ``src`` points
    at (any integer element type: fields never straddle its elements)."""
    if not src.dtype.is_int:
        raise semantic.err(f"packed data must be integers, '{src.name}' is {src.dtype}")
    w = src.dtype.bits
    word = src[at // w]
    return ((word >> (at % w)) if at % w else word) & ((1 << width) - 1)


def indices(n: int) -> list:
    """0 .. n - 1 at build time: a loop over them in a macro is unrolled, each value its own
    store (in a kernel, ``range`` is a runtime loop)."""
    return list(range(n))
