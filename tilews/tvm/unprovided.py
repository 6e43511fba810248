"""The error for a TVM name outside the part of TVM ``tilews.tvm`` provides (a
``tilews.unprovided.NotProvided``, as for the TileLang names tilews lacks)."""
from __future__ import annotations

from tilews.unprovided import NotProvided


class UnprovidedTVMName(NotProvided):
    """A TVM name outside the part of TVM tilews provides."""

    def __init__(self, module: str, name: str, provided):
        super().__init__(f"tilews does not provide TVM's {module}.{name}: tilews.{module} has only "
                         f"{', '.join(sorted(provided))} (the TVM names TileLang programs use for "
                         f"dtypes and bit-level arithmetic)")
