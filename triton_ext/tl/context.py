"""The state of one emission: output lines, Python names, and the enclosing ``T.Parallel``.

IR names become Python identifiers through one table, so user names, strides and temporaries never
collide with each other, with Python keywords or with the names the source uses (``tl``).
"""
from __future__ import annotations

import keyword
import os
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Optional

from tilews.lowering import ir
from tilews.lowering.errors import CompileError
from tilews.lowering.traverse import walk

TL_DTYPE = {ir.DType.BF16: "tl.bfloat16", ir.DType.F16: "tl.float16", ir.DType.F32: "tl.float32",
            ir.DType.F64: "tl.float64", ir.DType.I8: "tl.int8", ir.DType.I16: "tl.int16",
            ir.DType.I32: "tl.int32", ir.DType.I64: "tl.int64", ir.DType.U8: "tl.uint8",
            ir.DType.BOOL: "tl.int1", ir.DType.F8E4M3: "tl.float8e4nv", ir.DType.F8E5M2: "tl.float8e5"}

# names the generated source itself uses
_RESERVED = set(keyword.kwlist) | {"tl", "range", "float"}


@dataclass
class ParallelFrame:
    """An enclosing ``T.Parallel``: its variables (axis = position), extents and active masks."""
    vars: tuple[ir.Var, ...]
    extents: tuple[int, ...]
    masks: list[str] = field(default_factory=list)

    def axis(self, e: ir.Expr) -> Optional[int]:
        return self.vars.index(e) if isinstance(e, ir.Var) and e in self.vars else None

    def mask(self) -> Optional[str]:
        return " & ".join(self.masks) if self.masks else None


class Ctx:
    def __init__(self, kernel: ir.Kernel):
        self.kernel = kernel
        self.lines: list[str] = []
        self.depth = 0
        self._names: dict[str, str] = {}
        self._used = set(_RESERVED)
        self.par: Optional[ParallelFrame] = None
        self.scalars = {s.buffer for s in _allocs(kernel) if _is_scalar_local(s.buffer)}
        self.nonneg: set[ir.Var] = set(kernel.block_vars) | {
            d for p in kernel.buffer_params for d in p.shape if isinstance(d, ir.Var)}
        self.runtime: set[ir.Var] = set(kernel.block_vars)
        if not kernel.attr("specialize_scalar_params", False):
            self.runtime |= set(kernel.scalar_params)

    # -- names -------------------------------------------------------------------------------------
    def name(self, ir_name: str) -> str:
        """The Python identifier of an IR name (stable within the emission)."""
        if ir_name not in self._names:
            self._names[ir_name] = self._claim(ir_name)
        return self._names[ir_name]

    def stride(self, buf: ir.Buffer, d: int) -> str:
        return self.name(f"{buf.name}.stride{d}")

    def fresh(self, hint: str) -> str:
        """A new temporary, never equal to another name of this emission."""
        return self._claim(hint)

    def _claim(self, hint: str) -> str:
        base = hint.replace(".", "_")
        name, n = base, 0
        while name in self._used:
            n += 1
            name = f"{base}_{n}"
        self._used.add(name)
        return name

    # -- output ------------------------------------------------------------------------------------
    def line(self, text: str) -> None:
        self.lines.append("    " * self.depth + text)

    def origin(self, loc: ir.Loc) -> None:
        self.line(f"# tilews: {os.path.basename(loc.file)}:{loc.line}")

    @contextmanager
    def indent(self):
        self.depth += 1
        start = len(self.lines)
        try:
            yield
        finally:
            if len(self.lines) == start:
                self.line("pass")
            self.depth -= 1

    @contextmanager
    def parallel(self, frame: ParallelFrame):
        self.par = frame
        try:
            yield frame
        finally:
            self.par = None

    @contextmanager
    def masked(self, cond: str):
        self.par.masks.append(cond)
        try:
            yield
        finally:
            self.par.masks.pop()

    def unsupported(self, what: str, loc: ir.Loc, supported: str) -> CompileError:
        return CompileError(f"the triton backend does not support {what}", loc, [supported])


def _allocs(kernel: ir.Kernel):
    return (s for s in walk(kernel.body) if isinstance(s, ir.Alloc))


def _is_scalar_local(b: ir.Buffer) -> bool:
    return b.scope is ir.Scope.LOCAL and b.static_shape == (1,)


def shape_text(shape) -> str:
    return "(" + ", ".join(map(str, shape)) + ("," if len(shape) == 1 else "") + ")"
