"""User-facing errors (defined in ``tilews.lowering.errors``, which has no dependency on tilews)."""
from tilews.lowering.errors import (CompileError, DeadlockError, InternalError, RaceError,
                                    UninitializedReadError)

__all__ = ["CompileError", "DeadlockError", "InternalError", "RaceError", "UninitializedReadError"]
