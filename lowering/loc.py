"""``Loc``: a position in the user's source, carried by every IR node and every error.

Its own module so that ``errors`` (which locates errors) and ``ir`` (whose nodes carry one and
whose ``Kernel.plan`` raises an ``InternalError``) import it, and ``errors``, without importing
each other both ways.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Loc:
    """A position in the user's source."""
    file: str
    line: int
    col: int = 0

    def __str__(self) -> str:
        return f"{self.file}:{self.line}:{self.col}"


UNKNOWN_LOC = Loc("<unknown>", 0, 0)
