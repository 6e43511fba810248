"""Memory at a raw address: the interpreter's side of ``T.make_tensor`` (``ir.PointerView``).

Contract: ``AddressSpace.view(address, shape, strides, dtype, loc)`` is a numpy view (no copy) of
the host memory holding a ``shape`` tensor of ``dtype`` with ``strides`` (elements) at
``address``, so writes land in the caller's tensor whose ``data_ptr()`` the pointer table holds.
It refuses, with an ``InvalidAddressError`` at the user's line, an address that is 0, is not a
multiple of the element size, or (on Linux, from ``/proc/self/maps``) whose span is not inside one
readable and writable mapping of this process: a null or garbage entry, or a GPU address (the
interpreter runs on host memory only), is reported instead of crashing the process. Limits: an
address inside some *other* live allocation of the process passes, and is then read and written
as the program's shape claims; accesses outside that shape are masked like those of any global
tensor. Off Linux only the null and alignment checks apply. One ``AddressSpace`` per launch: the
mappings are read at its first check and again when an address is not in them.
"""
from __future__ import annotations

import bisect
import ctypes
import os
from typing import Optional, Sequence

import numpy as np

from .. import ir
from ..errors import InvalidAddressError
from .messages import at
from .values import storage

_MAPS = "/proc/self/maps"


class AddressSpace:
    def __init__(self):
        self._spans: Optional[list[tuple[int, int]]] = None

    def view(self, address: int, shape: Sequence[int], strides: Sequence[int], dtype: ir.DType,
             loc: ir.Loc) -> np.ndarray:
        item = dtype.itemsize
        if address == 0:
            raise InvalidAddressError(at(loc, "T.make_tensor got address 0 (a null pointer table "
                                              "entry)"))
        if address % item:
            raise InvalidAddressError(at(loc, f"T.make_tensor got address {address:#x}, not a "
                                              f"multiple of the {item}-byte size of {dtype}"))
        if min(shape) == 0:
            return np.empty(tuple(shape), dtype=storage(dtype))
        if any(s < 0 for s in strides):
            raise InvalidAddressError(at(loc, f"T.make_tensor: negative strides {list(strides)} "
                                              f"are not supported by the interpreter"))
        nbytes = (sum((n - 1) * s for n, s in zip(shape, strides)) + 1) * item
        if not self._mapped(address, address + nbytes):
            raise InvalidAddressError(at(loc, f"T.make_tensor: the {nbytes} bytes at {address:#x} "
                                              f"(shape {list(shape)}, {dtype}) are not host memory "
                                              f"of this process; the interpreter reads pointer "
                                              f"tables of CPU tensors' data_ptr() only"))
        raw = np.ctypeslib.as_array((ctypes.c_ubyte * nbytes).from_address(address))
        flat = raw.view(storage(dtype))
        return np.lib.stride_tricks.as_strided(flat, tuple(shape), tuple(s * item for s in strides))

    def _mapped(self, lo: int, hi: int) -> bool:
        if not os.path.exists(_MAPS):
            return True
        if self._spans is None or not _inside(self._spans, lo, hi):
            self._spans = _read_maps()
        return _inside(self._spans, lo, hi)


def _read_maps() -> list[tuple[int, int]]:
    """The readable and writable mappings, adjacent ones merged, sorted."""
    spans: list[tuple[int, int]] = []
    with open(_MAPS) as f:
        for line in f:
            fields = line.split()
            if not fields[1].startswith("rw"):
                continue
            lo, hi = (int(x, 16) for x in fields[0].split("-"))
            if spans and spans[-1][1] == lo:
                spans[-1] = (spans[-1][0], hi)
            else:
                spans.append((lo, hi))
    return spans


def _inside(spans: list[tuple[int, int]], lo: int, hi: int) -> bool:
    k = bisect.bisect_right(spans, (lo, float("inf"))) - 1
    return k >= 0 and spans[k][0] <= lo and hi <= spans[k][1]
