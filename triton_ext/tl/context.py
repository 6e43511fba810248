"""The state of one ``triton.language`` emission: a ``SourceWriter`` (lines, names) plus the
enclosing ``T.Parallel``, the scalar locals, the variables that are runtime values and the
kernel's ``StreamPlan``; and how values of the plan's ``f32_values`` types (bfloat16 and FP8 under
Triton's CPU interpreter) are held: in float32, rounded after each operation, and converted from
and to their bits in global memory, all on float32's bits with integer operations (Triton's own
conversions of these types are wrong there).
"""
from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Optional

from tilews.lowering import ir
from tilews.lowering.errors import CompileError, InternalError
from tilews.lowering.plans import StreamPlan
from tilews.lowering.traverse import subexprs, walk

from ..pysource import SourceWriter

TL_DTYPE = {d: f"tl.{d.record.triton}" for d in ir.DType}   # spelled from the dtype records

# float32 mantissa bits a type of ``StreamPlan.f32_values`` lacks (float32's exponent range)
_DROPPED_BITS = {ir.DType.BF16: 16}

# an FP8 type of ``StreamPlan.f32_values``: its mantissa bits, float32's biased exponent of its
# least normal value, and the code of an overflow (e4m3fn saturates, e5m2 is infinite)
_FP8 = {ir.DType.F8E4M3: (3, 121, 0x7E), ir.DType.F8E5M2: (2, 113, 0x7C)}
_FP8_NAN = 0x7F
# the least magnitude code of an FP8 type that is not finite, and whether every code from it on
# is a NaN (e4m3fn: 0x7F only) or it is infinity, the codes above it NaNs (e5m2)
_FP8_SPECIAL = {ir.DType.F8E4M3: (0x7F, True), ir.DType.F8E5M2: (0x7C, False)}

# names the generated source itself uses
_RESERVED = {"tl", "range", "float"}


@dataclass
class ParallelFrame:
    """An enclosing ``T.Parallel``: its variables (axis = position), extents, the shape of its
    tensors (``StreamPlan.tile`` of the extents), whether it is per-thread code
    (``Parallel.per_thread``) and the masks around the current statement, each with the loop axes
    it spans (the first, with padding, selecting the iterations that exist; then the enclosing
    ``if``s)."""
    vars: tuple[ir.Var, ...]
    extents: tuple[int, ...]
    shape: tuple[int, ...]
    per_thread: bool = False
    masks: list[tuple[str, frozenset[int]]] = field(default_factory=list)

    def axis(self, e: ir.Expr) -> Optional[int]:
        return self.vars.index(e) if isinstance(e, ir.Var) and e in self.vars else None

    def axes(self, exprs) -> frozenset[int]:
        """The loop axes a value computed from ``exprs`` spans: those of the parallel variables
        it reads (a value reading none is a scalar)."""
        return frozenset(self.vars.index(x) for e in exprs for x in subexprs(e) if x in self.vars)

    def mask(self) -> Optional[str]:
        return " & ".join(m for m, _ in self.masks) if self.masks else None

    def mask_axes(self) -> frozenset[int]:
        return frozenset().union(*(a for _, a in self.masks))


class Ctx(SourceWriter):
    def __init__(self, kernel: ir.Kernel, fast_math: bool = False):
        super().__init__(kernel, _RESERVED, fast_math)
        self.par: Optional[ParallelFrame] = None
        self.scalars = {s.buffer for s in _allocs(kernel) if _is_scalar_local(s.buffer)}
        self.runtime: set[ir.Var] = set(kernel.block_vars) | {v for v, _ in kernel.block_defs}
        self.plan: StreamPlan = kernel.plan(StreamPlan)
        if not self.plan.constant_scalar_params:
            self.runtime |= set(kernel.scalar_params)

    @contextmanager
    def parallel(self, frame: ParallelFrame):
        self.par = frame
        try:
            yield frame
        finally:
            self.par = None

    @contextmanager
    def masked(self, cond: str, axes: frozenset[int]):
        self.par.masks.append((cond, axes))
        try:
            yield
        finally:
            self.par.masks.pop()

    def shape(self, b: ir.Buffer) -> tuple[int, ...]:
        """The shape of the register tensor holding on-chip buffer ``b``."""
        return self.plan.tile(b.static_shape)

    def valid(self, extents) -> Optional[str]:
        """A mask over the tensor of a tile of ``extents`` selecting its elements that are not
        padding (None where there is no padding)."""
        shape, rank = self.plan.tile(extents), len(extents)
        return " & ".join(f"({arange(p, d, rank)} < {n})" for d, (n, p) in
                          enumerate(zip(extents, shape)) if n != p) or None

    # values of the plan's ``f32_values`` types (bfloat16 and FP8 under Triton's CPU interpreter)

    def held(self, dt: ir.DType) -> ir.DType:
        """The type the stream holds values of ``dt`` in: float32 for the plan's ``f32_values``."""
        return ir.DType.F32 if dt in self.plan.f32_values else dt

    def cast(self, value: str, dt: ir.DType) -> str:
        """``value`` (a tensor or a Python number) converted to a value of ``dt``, as ``held(dt)``
        holds it (a type of ``f32_values`` rounded: ``round_held``)."""
        if dt not in self.plan.f32_values:
            return f"tl.cast({value}, {TL_DTYPE[dt]})"
        return self.round_held(f"tl.cast({value}, tl.float32)", dt)

    def to(self, value: str, dt: ir.DType) -> str:
        """Tensor ``value`` converted to a value of ``dt`` (``cast``, spelled ``.to``)."""
        if dt not in self.plan.f32_values:
            return f"{value}.to({TL_DTYPE[dt]})"
        return self.round_held(f"{value}.to(tl.float32)", dt)

    def round_held(self, value: str, dt: ir.DType) -> str:
        """A float32 tensor rounded to the nearest value of ``dt`` (ties to even, on its bits; NaN
        kept; FP8 as ``round_bits``), still float32."""
        if dt in _FP8:
            return self.unpack(self.round_bits(value, dt), dt)
        drop = _DROPPED_BITS.get(dt)
        if drop is None:
            raise InternalError(f"triton backend: no rounding of float32 to {dt.value}")
        x, bits = self.fresh("wide"), self.fresh("bits")
        self.line(f"{x} = {value}")
        self.line(f"{bits} = {x}.to(tl.uint32, bitcast=True)")
        self.line(f"{bits} = (({bits} + {(1 << (drop - 1)) - 1} + (({bits} >> {drop}) & 1)) >> {drop}) << {drop}")
        return f"tl.where({x} != {x}, {x}, {bits}.to(tl.float32, bitcast=True))"

    def round_bits(self, value: str, dt: ir.DType) -> str:
        """A float32 tensor converted to FP8 type ``dt`` on its bits, as torch's ``.to`` does:
        to nearest even (subnormals too); beyond the largest finite value e4m3fn saturates and
        e5m2 is infinite; NaN keeps its sign."""
        mant, normal, overflow = _FP8[dt]
        drop = 23 - mant
        bits, mag, exp, sig, shift, code = (self.fresh(n) for n in
                                            ("bits", "mag", "exp", "sig", "shift", "code"))
        self.line(f"{bits} = ({value}).to(tl.uint32, bitcast=True)")
        self.line(f"{mag} = {bits} & 0x7FFFFFFF")
        self.line(f"{exp} = {mag} >> 23")
        # a subnormal of dt: the significand rounded at the bit worth dt's least subnormal
        self.line(f"{sig} = ({mag} & 0x7FFFFF) | 0x800000")
        self.line(f"{shift} = tl.minimum({normal + drop} - {exp}, 26)")
        sub = f"(({sig} + (1 << ({shift} - 1)) - 1 + (({sig} >> {shift}) & 1)) >> {shift})"
        # a normal: the bits rounded at dt's last mantissa bit, the exponent rebiased (a carry
        # into the exponent is right)
        norm = f"((({mag} + {(1 << (drop - 1)) - 1} + (({mag} >> {drop}) & 1)) >> {drop}) - {(normal - 1) << mant})"
        self.line(f"{code} = tl.minimum(tl.where({exp} >= {normal}, {norm}, {sub}), {overflow})")
        self.line(f"{code} = tl.where({mag} > 0x7F800000, {_FP8_NAN}, {code}) | (({bits} >> 24) & 0x80)")
        return f"{code}.to(tl.uint8).to({TL_DTYPE[dt]}, bitcast=True)"

    def unpack(self, stored: str, dt: ir.DType) -> str:
        """A tensor of element type ``dt`` as the stream holds it (its bits widened to float32's
        for ``f32_values``: exact; Triton's own conversion loses subnormals, and FP8's NaN and
        infinity)."""
        if dt not in self.plan.f32_values:
            return stored
        if dt in _FP8:
            return self._fp8_value(stored, dt)
        drop = _DROPPED_BITS[dt]
        return f"(({stored}).to(tl.uint{dt.bits}, bitcast=True).to(tl.uint32) << {drop})" \
               f".to(tl.float32, bitcast=True)"

    def _fp8_value(self, stored: str, dt: ir.DType) -> str:
        """FP8 tensor ``stored`` as float32 (exact): a normal's bits shifted into place and its
        exponent rebiased, a subnormal's significand scaled by its least subnormal (a power of
        two: exact), infinity and NaN spelled."""
        mant, normal, _ = _FP8[dt]
        special, all_nan = _FP8_SPECIAL[dt]
        bits, mag, wide = self.fresh("bits"), self.fresh("mag"), self.fresh("wide")
        self.line(f"{bits} = ({stored}).to(tl.uint8, bitcast=True).to(tl.uint32)")
        self.line(f"{mag} = {bits} & 0x7F")
        self.line(f"{wide} = ({mag} << {23 - mant}) + {(normal - 1) << 23}")
        self.line(f"{wide} = tl.where({mag} < {1 << mant}, "
                  f"({mag}.to(tl.float32) * {2.0 ** (normal - 127 - mant)!r}).to(tl.uint32, bitcast=True), {wide})")
        inf_or_nan = "0x7FC00000" if all_nan else f"0x7F800000 | (({mag} - {special}) << {23 - mant})"
        self.line(f"{wide} = tl.where({mag} >= {special}, {inf_or_nan}, {wide}) | (({bits} & 0x80) << 24)")
        return f"{wide}.to(tl.float32, bitcast=True)"

    def pack(self, value: str, dt: ir.DType) -> str:
        """A held value of ``dt`` as a tensor of element type ``dt`` (``unpack``'s inverse)."""
        if dt not in self.plan.f32_values:
            return value
        if dt in _FP8:
            return self.round_bits(f"tl.cast({value}, tl.float32)", dt)
        drop = _DROPPED_BITS[dt]
        return f"(tl.cast({value}, tl.float32).to(tl.uint32, bitcast=True) >> {drop})" \
               f".to(tl.uint{dt.bits}).to({TL_DTYPE[dt]}, bitcast=True)"

    def unsupported(self, what: str, loc: ir.Loc, supported: str) -> CompileError:
        return CompileError(f"the triton backend does not support {what}", loc, [supported])


def _allocs(kernel: ir.Kernel):
    return (s for s in walk(kernel.body) if isinstance(s, ir.Alloc))


def _is_scalar_local(b: ir.Buffer) -> bool:
    return b.scope is ir.Scope.LOCAL and b.static_shape == (1,)


def shape_text(shape) -> str:
    return "(" + ", ".join(map(str, shape)) + ("," if len(shape) == 1 else "") + ")"


def arange(n: int, axis: int, rank: int) -> str:
    """``tl.arange(0, n)`` laid along ``axis`` of a tensor of ``rank`` dims."""
    if rank == 1:
        return f"tl.arange(0, {n})"
    return f"tl.arange(0, {n})[{', '.join(':' if k == axis else 'None' for k in range(rank))}]"
