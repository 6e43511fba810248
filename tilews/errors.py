"""User-facing errors (defined in ``tilews.lowering.errors``, which has no dependency on tilews)."""
from tilews.lowering.errors import (CompileError, CompileTypeError, CompileValueError,
                                    DeadlockError, InternalError, InvalidAddressError,
                                    OutOfBoundsError, RaceError, ResourceLimitError,
                                    SharedOverlapError, UninitializedReadError)

__all__ = ["CompileError", "CompileTypeError", "CompileValueError", "DeadlockError",
           "InternalError", "InvalidAddressError", "OutOfBoundsError", "RaceError",
           "ResourceLimitError", "SharedOverlapError", "UninitializedReadError"]
