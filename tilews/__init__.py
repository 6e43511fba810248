"""tilews: a tile language for GPU kernels, compiled through Triton (Gluon on Hopper), Metal, or
run by a reference interpreter. TileLang's top-level names are here too (``import tilews as
tilelang``): ``jit``, ``compile``, ``lower``, ``JITKernel`` (tilews's ``Kernel``), ``autotune``,
``TensorSupplyType``, ``PassConfigKey``, ``DataType`` (tilews's ``DType``), ``cdiv``,
``next_power_of_2`` and ``layout``. ``tilews.extern`` holds the device functions
``T.call_extern`` calls (written in the tile language). ``tilews.ops`` (the ready-made ops) is
imported at its first use (PEP 562), so ``import tilews`` does not pay for it."""
__version__ = "0.1.0"

from .errors import (CompileError, DeadlockError, InternalError, OutOfBoundsError, RaceError,  # noqa: E402
                     UninitializedReadError)
from .jit import compile, jit  # noqa: E402
from .kernel import CompileReport, Kernel  # noqa: E402
from .engine import lower  # noqa: E402
from .lowering.ir import DType as DataType  # noqa: E402
from .math import cdiv, next_power_of_2  # noqa: E402
from .pass_config import PassConfigKey  # noqa: E402
from .profiler import TensorSupplyType  # noqa: E402
from .autotuner import autotune  # noqa: E402
from .targets import num_sms  # noqa: E402
from . import layout  # noqa: E402
from . import extern  # noqa: E402  (registers the T.call_extern implementations tilews ships)

JITKernel = Kernel   # TileLang's name of the compiled kernel

_LAZY = ("ops", "tvm")      # submodules imported at first attribute access

__all__ = ["CompileError", "CompileReport", "DataType", "DeadlockError", "InternalError", "JITKernel",
           "Kernel", "OutOfBoundsError", "PassConfigKey", "RaceError", "TensorSupplyType",
           "UninitializedReadError", "__version__", "autotune", "cdiv", "compile", "extern", "jit",
           "layout", "lower", "next_power_of_2", "num_sms", "ops", "tvm"]


def __getattr__(name: str):
    if name in _LAZY:
        import importlib
        return importlib.import_module(f"{__name__}.{name}")   # binds it on the package too
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))
