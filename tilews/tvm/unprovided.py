"""The error for a TVM name outside the part of TVM ``tilews.tvm`` provides."""
from __future__ import annotations


class UnprovidedTVMName(AttributeError):
    """A TVM name outside the part of TVM tilews provides."""

    def __init__(self, module: str, name: str, provided):
        super().__init__(f"tilews does not provide TVM's {module}.{name}: tilews.{module} has only "
                         f"{', '.join(sorted(provided))} (the TVM names TileLang programs use for "
                         f"dtypes and bit-level arithmetic)")
