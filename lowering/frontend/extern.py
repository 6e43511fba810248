"""Device functions written in the tile language, called by name: ``T.call_extern``.

TileLang splices CUDA source into a kernel (``T.import_source(src)``) and calls a function of it
(``T.call_extern(name, T.access_ptr(buf, "r"), ...)``). tilews compiles through Triton and Metal,
where CUDA source cannot go, so a name is bound instead to an *implementation* registered here: a
build-time callable (usually a ``@T.macro``) that receives the call's arguments and builds
ordinary statements where the call stands. Per-thread code in it is per-thread code of the kernel
(``threads.py`` lowers it like any other).

* ``access_ptr``: an ``AccessPtr`` — a buffer, a flat element offset into it and, when given, the
  number of elements the callee may touch. ``p[k]`` is element ``offset + k`` of the buffer in
  row-major order (a load, or a store target), checked against the extent and the buffer's size
  where both are known at build time.
* ``import_source``: the source is recorded for the kernel being built; it is never compiled.
* ``call``: the named implementation applied to the arguments. A name with none is a
  ``CompileError`` at the call saying how to register one. Where the kernel imported source, that
  source must define the name and contain the implementation's ``signature`` strings (a cheap
  check that the imported function is the one the implementation computes).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Optional

from .. import ir
from .context import builder
from .semantic import err
from .values import BufferRef, ElementRef, RegionRef, Scalar

_MODES = {"r": 1, "w": 2, "rw": 3}


@dataclass(frozen=True)
class Extern:
    """A registered implementation: ``impl(*args)`` builds the call; an imported source that
    defines the name must contain every string of ``signature``."""
    name: str
    impl: Callable[..., Any]
    signature: tuple[str, ...]


_REGISTRY: dict[str, Extern] = {}


def register(name: str, impl: Callable[..., Any], signature: tuple[str, ...] = ()) -> None:
    if not isinstance(name, str) or not name.isidentifier():
        raise ValueError(f"register_extern: name must be a C identifier, got {name!r}")
    if not callable(impl):
        raise TypeError(f"register_extern({name!r}): the implementation must be a @T.macro (or a "
                        f"function called at build time), got {impl!r}")
    _REGISTRY[name] = Extern(name, impl, tuple(signature))


def registered(name: str) -> Optional[Extern]:
    return _REGISTRY.get(name)


class AccessPtr:
    """``T.access_ptr(...)``: elements ``offset, offset + 1, ...`` of ``buffer`` (row-major)."""
    __slots__ = ("buffer", "offset", "extent")

    def __init__(self, buffer: ir.Buffer, offset, extent: Optional[int]):
        self.buffer, self.offset, self.extent = buffer, offset, extent

    @property
    def dtype(self) -> ir.DType:
        return self.buffer.dtype

    @property
    def name(self) -> str:
        return self.buffer.name

    def __repr__(self) -> str:
        return f"AccessPtr({self.buffer.name} + {self.offset})"

    def __getitem__(self, k) -> ElementRef:
        if isinstance(k, int) and self.extent is not None and not 0 <= k < self.extent:
            raise err(f"element {k} through T.access_ptr('{self.name}') is outside the "
                      f"{self.extent} elements the pointer covers")
        flat = self.offset + k
        size = _size(self.buffer)
        if isinstance(flat, int) and size is not None and not 0 <= flat < size:
            raise err(f"element {flat} of '{self.name}' (through T.access_ptr) is outside the "
                      f"buffer, which holds {size} elements")
        return BufferRef(self.buffer)[_unflatten(flat, self.buffer)]


def access_ptr(base, access_type, extents: tuple, offset, extent) -> AccessPtr:
    if access_type not in _MODES and access_type not in _MODES.values():
        raise err(f"T.access_ptr: access_type must be 'r', 'w' or 'rw' (or 1, 2, 3), got "
                  f"{access_type!r}")
    if isinstance(base, BufferRef):
        buf, starts = base.buffer, (0,) * len(base.buffer.shape)
    elif isinstance(base, RegionRef):
        buf, starts = base.region.buffer, tuple(Scalar(s) for s in base.region.starts)
        extents = extents or base.region.extents
    elif isinstance(base, ElementRef):
        buf, starts = base.buffer, tuple(Scalar(i) for i in base.indices)
    else:
        raise err(f"T.access_ptr: base must be a buffer, an element (buf[i]) or a region "
                  f"(buf[a:b]), got {base!r}")
    if buf.scope is ir.Scope.BARRIER:
        raise err(f"T.access_ptr: '{buf.name}' is a barrier, not memory a function reads")
    if extent is None and extents:
        extent = 1
        for e in extents:
            extent = extent * e
    if extent is not None and not isinstance(extent, int):
        extent = None       # a runtime extent: accesses are checked against the buffer only
    return AccessPtr(buf, _flatten(starts, buf) + offset, extent)


def import_source(source) -> None:
    if source is None:      # TileLang's T.import_source(None) imports nothing
        return
    if not isinstance(source, str):
        raise err(f"T.import_source: source must be a string of device code, got "
                  f"{type(source).__name__}")
    if source not in builder().imported_sources:
        builder().imported_sources.append(source)


def call(name, args: tuple, kwargs: dict):
    if not isinstance(name, str):
        raise err(f"T.call_extern: the function name must be a string, got {name!r}")
    entry = _REGISTRY.get(name)
    if entry is None:
        raise err(f"T.call_extern({name!r}): tilews has no implementation of '{name}'. tilews "
                  f"compiles through Triton and Metal, so the CUDA source of T.import_source is "
                  f"not compiled; write the function in the tile language and register it",
                  [f"tilews.extern.register_extern({name!r}, impl) before the kernel is built, "
                   f"with impl a @T.macro taking the call's arguments (a T.access_ptr indexes "
                   f"like a 1-d buffer: p[k])",
                   f"registered: {', '.join(sorted(_REGISTRY)) or 'none'}"])
    _check_source(entry)
    return entry.impl(*args, **kwargs)


def _check_source(entry: Extern) -> None:
    sources = builder().imported_sources
    if not sources:
        return
    defining = [s for s in sources if entry.name in s]
    if not defining:
        raise err(f"T.call_extern({entry.name!r}): no source given to T.import_source mentions "
                  f"'{entry.name}'; the call and the imported source disagree")
    missing = [m for m in entry.signature if not any(m in s for s in defining)]
    if missing:
        raise err(f"T.call_extern({entry.name!r}): the imported source's '{entry.name}' is not "
                  f"the function tilews implements under that name (the source lacks "
                  f"{', '.join(repr(m) for m in missing)})")


def _size(buf: ir.Buffer) -> Optional[int]:
    dims = [ir.as_int(d) for d in buf.shape]
    if any(d is None for d in dims):
        return None
    size = 1
    for d in dims:
        size *= d
    return size


def _flatten(starts: tuple, buf: ir.Buffer):
    flat: Any = 0
    for s, d in zip(starts, buf.shape):
        dim = ir.as_int(d)
        flat = flat * (dim if dim is not None else Scalar(d)) + s
    return flat


def _unflatten(flat, buf: ir.Buffer) -> tuple:
    idx = []
    for d in reversed(buf.shape[1:]):
        dim = ir.as_int(d)
        dim = dim if dim is not None else Scalar(d)
        idx.append(flat % dim)
        flat = flat // dim
    idx.append(flat)
    return tuple(reversed(idx))
