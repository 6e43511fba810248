"""Errors a user can reach, each carrying the location of the user's source line.

Rendered once (``CompileError.__str__``): ``file:line:col: message``, the source line, a caret
and any notes. ``tilews.errors`` re-exports these.
"""
from __future__ import annotations

import linecache
from typing import Optional, Sequence

from .ir import Loc


class CompileError(Exception):
    """A program tilews cannot compile, located at the user's line."""

    def __init__(self, message: str, loc: Optional[Loc] = None, notes: Sequence[str] = ()):
        self.message = message
        self.loc = loc
        self.notes = tuple(notes)
        super().__init__(self.render())

    def render(self) -> str:
        if self.loc is None or self.loc.line <= 0:
            head = self.message
            lines = []
        else:
            head = f"{self.loc.file}:{self.loc.line}:{self.loc.col}: {self.message}"
            src = linecache.getline(self.loc.file, self.loc.line).rstrip("\n")
            lines = [f"    {src}", "    " + " " * self.loc.col + "^"] if src else []
        return "\n".join([head, *lines, *(f"note: {n}" for n in self.notes)])


class InternalError(CompileError):
    """A bug in tilews (a pass let through something a later stage has no rule for)."""


class RaceError(Exception):
    """The reference interpreter saw conflicting shared-memory accesses not ordered by a barrier."""


class DeadlockError(Exception):
    """The reference interpreter saw every live role blocked on a barrier."""


class UninitializedReadError(Exception):
    """The reference interpreter saw a read of memory nothing wrote."""


class OutOfBoundsError(IndexError):
    """The reference interpreter saw an on-chip buffer accessed outside its shape."""


class CompileTypeError(CompileError, TypeError):
    """A kernel argument or operand of the wrong type (also a ``TypeError``)."""


class CompileValueError(CompileError, ValueError):
    """A kernel argument or operand of the wrong shape or value (also a ``ValueError``)."""
