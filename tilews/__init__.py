"""tilews: a tile language for GPU kernels, compiled through Triton (Gluon on Hopper), Metal, or
run by a reference interpreter."""
__version__ = "0.1.0"

from .errors import CompileError, DeadlockError, OutOfBoundsError, RaceError, UninitializedReadError  # noqa: E402
from .jit import jit  # noqa: E402
from .kernel import CompileReport, Kernel  # noqa: E402
from .targets import num_sms  # noqa: E402

__all__ = ["CompileError", "CompileReport", "DeadlockError", "Kernel", "OutOfBoundsError", "RaceError",
           "UninitializedReadError", "__version__", "jit", "num_sms"]
