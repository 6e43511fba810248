"""How a TileLang program is made to run on tilews: its import lines rewritten, and the
``PYTHONPATH`` that puts this checkout's tilews first. Shared by ``tilelang_examples.py`` (example
files run as scripts) and ``tilelang_suite.py`` (TileLang's example tests under pytest).

The rewrite changes import lines of ``tilelang`` and of the TVM names TileLang re-exports, and
nothing else:

    import tilelang                       -> import tilews as tilelang
    import tilelang as tl                 -> import tilews as tl
    import tilelang.language as T         -> import tilews.language as T
    import tilelang.testing               -> import tilews.testing, tilews as tilelang
    from tilelang.X import Y              -> from tilews.X import Y
    import tvm                            -> import tilews.tvm as tvm
    from tvm.tirx import X                -> from tilews.tvm.tirx import X

A dotted import without ``as`` binds its top-level name and imports the submodule, so
``tilelang.testing.X`` then reads ``tilews.testing.X``. Only the first line of a parenthesized
``from ... import (`` changes; an ``import`` statement of ``tilelang`` that is not a plain list of
(dotted) names raises ``ValueError`` rather than be half-rewritten.
"""
from __future__ import annotations

import os
import re

# TileLang's modules -> the tilews modules that stand for them
MODULES = {"tilelang": "tilews", "tvm": "tilews.tvm"}

_TOP = "|".join(MODULES)
_FROM = re.compile(rf"^(?P<indent>\s*)from\s+(?P<top>{_TOP})(?P<sub>(\.\w+)*)(?P<rest>\s+import\b.*)$")
_IMPORT = re.compile(r"^(?P<indent>\s*)import\s+(?P<names>[^#]*?)(?P<comment>\s*#.*)?$")
_OURS = re.compile(rf"\s*(?:{_TOP})\b")        # a name of an import statement that is ours
_NAME = re.compile(r"^\s*(?P<top>\w+)(?P<sub>(\.\w+)*)(\s+as\s+(?P<alias>\w+))?\s*$")


def rewrite_line(line: str) -> str:
    """One import line of ``tilelang`` or ``tvm`` -> the same import of tilews; other lines
    unchanged."""
    m = _FROM.match(line)
    if m:
        return f"{m['indent']}from {MODULES[m['top']]}{m['sub']}{m['rest']}"
    m = _IMPORT.match(line)
    if m is None:
        return line
    names = m["names"].split(",")
    if not any(_OURS.match(n) for n in names):
        return line
    parsed = [_NAME.match(n) for n in names]
    if not all(parsed):
        raise ValueError(f"cannot rewrite {line.strip()!r} (not a plain list of imported names)")
    new = ", ".join(_rewrite_name(p) for p in parsed)
    return f"{m['indent']}import {new}{m['comment'] or ''}"


def _rewrite_name(p: re.Match) -> str:
    """One name of an ``import`` statement: ``top.sub as alias``."""
    top, sub, alias = p["top"], p["sub"], p["alias"]
    if top not in MODULES:
        return p.group(0).strip()
    new = MODULES[top]
    if alias:
        return f"{new}{sub} as {alias}"
    if sub:                         # binds ``top`` and imports the submodule
        return f"{new}{sub}, {new} as {top}"
    return f"{new} as {top}"


def rewrite(source: str) -> tuple[str, list[tuple[str, str]]]:
    """(the rewritten source, the (old, new) import lines)."""
    out, changed = [], []
    for line in source.splitlines(keepends=True):
        body = line.rstrip("\r\n")
        new = rewrite_line(body)
        if new != body:
            changed.append((body.strip(), new.strip()))
        out.append(new + line[len(body):])
    return "".join(out), changed


def tilews_pythonpath(extra: tuple[str, ...] = ()) -> str:
    """``PYTHONPATH`` with the working directory (this checkout's tilews) first, then ``extra``,
    then what was there. The working directory, not this file's folder: ``scripts/device_run.sh``
    may run from a view of the checkout made of symlinks, which resolving would leave."""
    return os.pathsep.join(filter(None, (os.getcwd(), *extra, os.environ.get("PYTHONPATH"))))
