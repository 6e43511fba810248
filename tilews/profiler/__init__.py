"""TileLang's profiler surface: ``TensorSupplyType``, ``do_bench`` and the ``Profiler`` that
``Kernel.get_profiler()`` returns (``from tilews.profiler import do_bench``)."""
from .bench import do_bench
from .profiler import Profiler
from .supply import TensorSupplyType

__all__ = ["Profiler", "TensorSupplyType", "do_bench"]
