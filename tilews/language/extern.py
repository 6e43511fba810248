"""Device functions called by name: ``T.call_extern``, ``T.access_ptr``, ``T.import_source``.

TileLang splices CUDA source into a kernel and calls its functions; tilews compiles through
Triton and Metal, so each name is bound to an implementation written in the tile language
(``tilews.extern.register_extern``; tilews ships TileLang's dequantizing decoders). See
``lowering/frontend/extern.py``.
"""
from __future__ import annotations

from tilews.lowering.frontend import extern, semantic


def access_ptr(base, access_type="r", *extents, offset=0, extent=None, ignore_last_ndim: int = 0):
    """``T.access_ptr(buf, "r")`` (or ``buf[i]``, ``buf[a:b]``): a pointer to the elements of
    ``buf`` from that place on, plus ``offset``, for a function ``T.call_extern`` calls.
    ``extents`` (or ``extent``) bound how many elements the callee may touch. ``p[k]`` reads or
    writes element k from the pointer's start."""
    if ignore_last_ndim:
        raise semantic.err("T.access_ptr(ignore_last_ndim=...) is not supported")
    if len(extents) == 1 and isinstance(extents[0], (tuple, list)):
        extents = tuple(extents[0])
    return extern.access_ptr(base, access_type, extents, offset, extent)


def import_source(source=None) -> None:
    """``T.import_source(src)``: TileLang's device source for the functions the kernel calls.
    tilews records it (it is never compiled) and checks each ``T.call_extern`` against it."""
    extern.import_source(source)


def call_extern(*args, dtype=None, **kwargs):
    """``T.call_extern(name, *args, dtype=...)`` (or TileLang's ``T.call_extern(dtype, name,
    *args)``): the tile-language implementation registered for ``name``
    (``tilews.extern.register_extern``) applied to ``args`` where the call stands; its value is
    the implementation's return value (``None`` for functions that only write memory). ``dtype``,
    the C function's result type, is TileLang's; the implementation decides what the call gives."""
    if dtype is None and len(args) >= 2 and isinstance(args[1], str) and not _known(args[0]):
        args = args[1:]         # TileLang's T.call_extern(dtype, name, *args)
    if not args:
        raise semantic.err("T.call_extern: the function name is missing")
    return extern.call(args[0], args[1:], kwargs)


def _known(name) -> bool:
    return isinstance(name, str) and extern.registered(name) is not None
