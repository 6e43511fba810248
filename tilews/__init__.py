"""tilews: a tile language for GPU kernels, compiled through Triton (Gluon on Hopper), Metal, or
run by a reference interpreter."""
from .errors import CompileError, DeadlockError, RaceError, UninitializedReadError

__version__ = "0.1.0"
__all__ = ["CompileError", "DeadlockError", "RaceError", "UninitializedReadError", "__version__"]
