"""How the interpreter names things in its error messages.

Contract: ``at(loc, text)`` prefixes ``text`` with the user's ``file:line:col``; ``role_name``
spells a role as the user wrote it (``T.ws(1, 2)``); ``box_text`` spells an index box.
"""
from __future__ import annotations

from .. import ir


def at(loc: ir.Loc, text: str) -> str:
    return f"{loc}: {text}"


def role_name(warpgroups: tuple[int, ...]) -> str:
    return f"T.ws({', '.join(str(g) for g in warpgroups)})"


def box_text(box: tuple[tuple[int, int], ...]) -> str:
    return "[" + ", ".join(f"{lo}:{hi}" for lo, hi in box) + "]"
