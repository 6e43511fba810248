"""The small part of TVM's Python surface that TileLang programs use, as tilews values.

TileLang programs import TVM names that TileLang re-exports (``from tvm import DataType, tirx``,
``from tilelang import tvm``, then ``tvm.tirx.const(...)``); here they are tilews's:

* ``DataType(x)``: the dtype of a name or dtype (``tilews.language.dtype``), whose ``.bits`` the
  examples read to size their tiles;
* ``tirx``: constants, casts, bit-casts, selects and ``Min`` on kernel values (``tilews.tvm.tirx``).

Any other name raises ``UnprovidedTVMName`` (an ``AttributeError``) saying that tilews does not
provide it.
"""
from __future__ import annotations

from tilews.lowering.dtypes import DType as DataType

from . import tirx
from .unprovided import UnprovidedTVMName

__all__ = ["DataType", "UnprovidedTVMName", "tirx"]


def __getattr__(name: str):
    if name.startswith("__"):        # (module protocol lookups: copy, pickle, inspect)
        raise AttributeError(name)
    raise UnprovidedTVMName("tvm", name, ("DataType", "tirx"))
