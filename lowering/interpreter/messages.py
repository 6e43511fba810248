"""How the interpreter names things in its error messages.

Contract: ``at(loc, text)`` prefixes ``text`` with the user's ``file:line:col``; ``box_text``
spells an index box. Roles are spelled by ``roles.describe`` (``T.ws(1, 2)``); a deadlock (its
blocked waits, its barriers' states) by ``protocol.deadlock_report`` / ``wait_text`` /
``barrier_state``, which ``check_barriers`` shares to report the same deadlock at compile time.
"""
from __future__ import annotations

from .. import ir


def at(loc: ir.Loc, text: str) -> str:
    return f"{loc}: {text}"


def box_text(box: tuple[tuple[int, int], ...]) -> str:
    return "[" + ", ".join(f"{lo}:{hi}" for lo, hi in box) + "]"
