"""User-facing errors (defined in ``tilews.lowering.errors``, which has no dependency on tilews)."""
from tilews.lowering.errors import (CompileError, DeadlockError, InternalError, OutOfBoundsError,
                                    RaceError, UninitializedReadError)

__all__ = ["CompileError", "DeadlockError", "InternalError", "OutOfBoundsError", "RaceError",
           "UninitializedReadError"]
