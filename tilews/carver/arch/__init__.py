"""``tilelang.carver.arch``: only the ``driver`` module (``from tilelang.carver.arch import driver``)."""
from . import driver

__all__ = ["driver"]
