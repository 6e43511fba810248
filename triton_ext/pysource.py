"""Writing the Python source of a Triton module, shared by the ``tl`` and Gluon emitters.

``SourceWriter`` holds one emission's output lines, indentation and Python names: IR names become
identifiers through one table, so user names, strides and temporaries never collide with each other,
with Python keywords or with the names the module itself uses. It also tracks which integer
variables are non-negative by construction (block indices, runtime dims, loop indices counting up
from a non-negative start), so ``//`` and ``%`` can be spelled natively where Python's and
Triton's rounding agree, and whether fp32 division and square root take their IEEE-rounded
forms (``ieee_rounded``: unless the compile asked for fast math). ``host_expr`` spells a grid
extent as host Python (the ``<kernel>_grid`` function both modules end with).
"""
from __future__ import annotations

import keyword
import os
import re
from contextlib import contextmanager

from tilews.lowering import ir, simplify
from tilews.lowering.errors import InternalError

GRID_SUFFIX = "_grid"


class SourceWriter:
    def __init__(self, kernel: ir.Kernel, reserved: set[str], fast_math: bool = False):
        self.kernel = kernel
        self.fast_math = fast_math
        self.lines: list[str] = []
        self.depth = 0
        self._names: dict[str, str] = {}
        self._used = set(keyword.kwlist) | reserved
        self.nonneg: set[ir.Var] = simplify.never_negative(kernel)
        # the values integer variables take where they are bound (inclusive): block indices of
        # build-time grid extents now, loop and parallel variables as their loops are spelled
        self.ranges: dict[ir.Var, tuple[int, int]] = {
            v: (0, g - 1) for v, g in zip(kernel.block_vars, map(ir.as_int, kernel.grid))
            if g is not None and not kernel.block_defs and not kernel.swizzle_panel}

    def ieee_rounded(self, dtype: ir.DType) -> bool:
        """Whether a division or square root computed in ``dtype`` is spelled in its IEEE-rounded
        form (``div_rn``, ``sqrt_rn``: fp32 only) rather than Triton's default approximate one
        (``div.full.f32``, ``sqrt.approx.f32``): yes for fp32 unless fast math was asked for."""
        return dtype is ir.DType.F32 and not self.fast_math

    def cast(self, value: str, dt: ir.DType) -> str:
        """``value`` (a tensor or a Python number) converted to a value of ``dt``, in the
        emitter's language."""
        raise NotImplementedError

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


def nonneg(w: SourceWriter, e: ir.Expr) -> bool:
    """Whether an integer expression is >= 0 by construction (``simplify.nonneg`` with the
    variables this writer knows to be)."""
    return simplify.nonneg(e, w.nonneg)


FLOAT_DIVISIONS = frozenset({ir.BinOpKind.DIV, ir.BinOpKind.FLOORDIV, ir.BinOpKind.MOD})
_DIV_RN = {"tl": "tl.math.div_rn", "gl": "gl.div_rn"}


def float_division(w: SourceWriter, e: ir.BinOp, a: str, b: str, lang: str) -> str:
    """Float ``/``, ``//`` or ``%`` ``e`` (``FLOAT_DIVISIONS``) of operands spelled ``a`` and ``b``
    (of ``e``'s type, or Python numbers), as docs/design.md's numeric contract has it: ``/``
    IEEE-rounded (``div_rn``) where ``w.ieee_rounded``, ``//`` the floor of that quotient, ``%``
    Python's (``_float_mod``). Triton computes ``/`` and ``%`` of a 16-bit float in float32: such
    a quotient is divided there (of the operands converted to float32; ``div_rn``, rounded again
    to 16 bits, is their IEEE quotient); it and a remainder of a type narrower than float32
    are rounded to the type (``w.cast``, the emitter's conversion) before anything uses them,
    and the floor is then taken in float32 (exact). ``lang``: the language module's name (tl, gl)."""
    dt = e.dtype
    if e.op is ir.BinOpKind.MOD:
        return _narrowed(w, _float_mod(w, a, b, lang), dt)
    computed = ir.DType.F32 if dt in (ir.DType.F16, ir.DType.BF16) else dt
    if computed is not dt:
        a, b = (x if isinstance(o, ir.Const) else w.cast(x, computed) for o, x in ((e.a, a), (e.b, b)))
    q = f"{_DIV_RN[lang]}({a}, {b})" if w.ieee_rounded(computed) else f"({a} / {b})"
    if e.op is ir.BinOpKind.DIV:
        return _narrowed(w, q, dt)
    if dt.bits >= 32:
        return f"{lang}.floor({q})"
    return w.cast(f"{lang}.floor({lang}.cast({_narrowed(w, q, dt)}, {lang}.float32))", dt)


def _narrowed(w: SourceWriter, x: str, dt: ir.DType) -> str:
    """``x``, a float ``/`` or ``%`` of type ``dt`` as Triton computes it, rounded to ``dt``."""
    return w.cast(x, dt) if dt.bits < 32 else x


def minmax(w: SourceWriter, e: ir.Call, args: list[str], lang: str) -> str:
    """``T.max``/``T.min`` call ``e`` of operands ``args`` (spelled), in ``e``'s type: Triton
    computes a bfloat16's in float32, and a narrower type's with a Python number (which it makes
    an int32 or float32 tensor) in that type, so such a result is converted back (``w.cast``;
    exact: it is one of the operands). ``lang``: the language module's name (tl, gl)."""
    out = args[0]
    for a in args[1:]:
        out = f"{lang}.{'maximum' if e.fn is ir.MathFn.MAX else 'minimum'}({out}, {a})"
    constant = any(isinstance(a, ir.Const) for a in e.args)
    widened = e.dtype.bits < 32 and (constant or e.dtype is ir.DType.BF16)
    return w.cast(out, e.dtype) if widened else out


def _float_mod(w: SourceWriter, a: str, b: str, lang: str) -> str:
    """Python's float ``a % b`` from Triton's (C's ``fmod``: exact, with the dividend's sign):
    plus the divisor where the signs differ; ``lang`` the language module's name (tl, gl)."""
    r = w.fresh("r")
    w.line(f"{r} = {a} % {b}")
    return f"{lang}.where(({r} != 0) & (({r} < 0) != ({b} < 0)), {r} + {b}, {r})"


def atom(text: str) -> str:
    """``text`` parenthesized unless it already is a name, a number or one parenthesized group."""
    if re.fullmatch(r"[\w.]+", text):
        return text
    if text.startswith("(") and text.endswith(")"):
        depth = 0
        for k, ch in enumerate(text):
            depth += {"(": 1, ")": -1}.get(ch, 0)
            if depth == 0:
                if k == len(text) - 1:
                    return text
                break
    return f"({text})"


def host_expr(w: SourceWriter, e: ir.Expr) -> str:
    """A grid extent as host Python (whose integer semantics are the IR's)."""
    if isinstance(e, ir.Const):
        return repr(e.value)
    if isinstance(e, ir.Var) and e.kind is ir.VarKind.PARAM:
        return w.name(e.name)
    if isinstance(e, ir.BinOp) and e.dtype.is_int and e.op.value not in ("and", "or", "/"):
        return f"({host_expr(w, e.a)} {e.op.value} {host_expr(w, e.b)})"
    if isinstance(e, ir.Call) and e.fn in (ir.MathFn.MIN, ir.MathFn.MAX):
        return f"{e.fn.value}({', '.join(host_expr(w, a) for a in e.args)})"
    raise InternalError(f"grid extent {type(e).__name__} cannot be computed on the host",
                        getattr(e, "loc", None))
