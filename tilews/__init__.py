"""tilews: a tile language for GPU kernels, compiled through Triton (Gluon on Hopper), Metal, or
run by a reference interpreter. TileLang's top-level names are here too (``import tilews as
tilelang``): ``jit``, ``autotune``, ``TensorSupplyType``, ``PassConfigKey``, ``layout``. ``tilews.ops`` (the
ready-made ops) is imported at its first use (PEP 562), so ``import tilews`` does not pay for it."""
__version__ = "0.1.0"

from .errors import (CompileError, DeadlockError, InternalError, OutOfBoundsError, RaceError,  # noqa: E402
                     UninitializedReadError)
from .jit import jit  # noqa: E402
from .kernel import CompileReport, Kernel  # noqa: E402
from .pass_config import PassConfigKey  # noqa: E402
from .profiler import TensorSupplyType  # noqa: E402
from .autotuner import autotune  # noqa: E402
from .targets import num_sms  # noqa: E402
from . import layout  # noqa: E402

_LAZY = ("ops",)      # submodules imported at first attribute access

__all__ = ["CompileError", "CompileReport", "DeadlockError", "InternalError", "Kernel", "OutOfBoundsError",
           "PassConfigKey", "RaceError", "TensorSupplyType", "UninitializedReadError",
           "__version__", "autotune", "jit", "layout", "num_sms", "ops"]


def __getattr__(name: str):
    if name in _LAZY:
        import importlib
        return importlib.import_module(f"{__name__}.{name}")   # binds it on the package too
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))
