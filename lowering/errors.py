"""Errors a user can reach, each carrying the location of the user's source line.

Rendered once (``CompileError.__str__``): ``file:line:col: message``, the source line, a caret
and any notes. ``tilews.errors`` re-exports these.

Two kinds of compile failure, never confused (docs/design.md §7, "Errors"):

* ``CompileError``: the user's program cannot be compiled (a refusal, a limit, a mistake); the
  user fixes their program.
* ``InternalError``: a bug in tilews (a pass let through something a later stage has no rule
  for, a pass or emitter crashed, Triton rejected the generated code). It is *not* a
  ``CompileError``, so no ``except CompileError`` (a fallback chain, a caller) can take it for a
  refusal. ``tilews.compiler`` is the boundary that turns any foreign exception of lowering,
  emitting or loading into one and writes a reproducer, whose folder ``reproducer`` names.
"""
from __future__ import annotations

import linecache
from typing import Optional, Sequence

from .loc import Loc


class CompileError(Exception):
    """A program tilews cannot compile, located at the user's line."""

    def __init__(self, message: str, loc: Optional[Loc] = None, notes: Sequence[str] = ()):
        self.message = message
        self.loc = loc
        self.notes = tuple(notes)
        super().__init__(self.render())

    def render(self) -> str:
        return _render(self.message, self.loc, self.notes)


def _render(message: str, loc: Optional[Loc], notes: Sequence[str]) -> str:
    """``file:line:col: message``, the source line and a caret (where ``loc`` is known), notes."""
    if loc is None or loc.line <= 0:
        head = message
        lines = []
    else:
        head = f"{loc.file}:{loc.line}:{loc.col}: {message}"
        src = linecache.getline(loc.file, loc.line).rstrip("\n")
        lines = [f"    {src}", "    " + " " * loc.col + "^"] if src else []
    return "\n".join([head, *lines, *(f"note: {n}" for n in notes)])


class InternalError(Exception):
    """A bug in tilews, not in the user's program: a pass let through something a later stage has
    no rule for, a pass or emitter crashed, or Triton (ptxas, a C++ compiler) rejected the code
    tilews generated. Located at the user's line where known; ``reproducer`` is the folder the
    compiler wrote the IR and generated source to (None until it has)."""

    def __init__(self, message: str, loc: Optional[Loc] = None, notes: Sequence[str] = (),
                 reproducer: Optional[str] = None):
        self.message = message
        self.loc = loc
        self.notes = tuple(notes)
        self.reproducer = reproducer
        super().__init__(self.render())

    def render(self) -> str:
        report = (f"please report it with the reproducer written to {self.reproducer}"
                  if self.reproducer else "please report it")
        return _render(f"internal error: {self.message}", self.loc,
                       (*self.notes, f"this is a bug in tilews, not in your program; {report}"))


class RaceError(Exception):
    """The reference interpreter saw conflicting shared-memory accesses not ordered by a barrier."""


class DeadlockError(Exception):
    """The reference interpreter saw every live role blocked on a barrier."""


class UninitializedReadError(Exception):
    """The reference interpreter saw a read of memory nothing wrote."""


class SharedOverlapError(UninitializedReadError):
    """The reference interpreter saw a read of shared bytes that another buffer, placed on the
    same bytes by the shared-memory plan, wrote while the read buffer was still live."""


class OutOfBoundsError(IndexError):
    """The reference interpreter saw an on-chip buffer accessed outside its shape."""


class InvalidAddressError(ValueError):
    """The reference interpreter was given an address (``T.make_tensor``) that is no host memory
    it may view: null, misaligned, or outside this process's mappings."""


class ResourceLimitError(CompileError):
    """A valid program whose lowered form needs more of the machine than this backend has (shared
    memory after that backend's own schedule: rings, per-tile slots, staging; or with its
    toolchain's scratch beside them, after lowering again for less). Unlike other
    ``CompileError``s it is no verdict on the program: a compile chain treats it as the backend's
    refusal and tries the next backend (``tilews.compiler``), which plans differently; only the
    last backend's limit reaches the user, after the earlier ones' reasons."""


class CompileTypeError(CompileError, TypeError):
    """A kernel argument or operand of the wrong type (also a ``TypeError``)."""


class CompileValueError(CompileError, ValueError):
    """A kernel argument or operand of the wrong shape or value (also a ``ValueError``)."""
