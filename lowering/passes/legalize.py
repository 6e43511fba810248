"""legalize: record the target's choices in the IR, so emitters only spell them.

Requires:  despecialize has run (on targets without warp specialization, no roles or barriers).
Ensures:   every ``Copy.mechanism`` is DIRECT or MASKED: DIRECT when each global region it touches
           is provably inside its buffer (static dims; interval analysis of the starts over block
           indices, loop ranges and parallel extents) or when no global buffer is involved, MASKED
           otherwise. Every global access (a ``Region``, ``Load`` or ``Store`` of a global buffer)
           has ``mask_low``: per dim, True unless the same interval analysis proves its start or
           index non-negative (then an emitter's mask need not check ``>= 0`` there; starts that
           may be negative make the copy MASKED). Every ``Gemm.instr`` is DOT, or DOT_F32_OPERANDS
           on ``config.caps.triton_interpreter`` for float operands narrower than 32 bits (its dot is
           wrong on bf16; the upcast is exact). ``T.unroll`` loops whose bounds are not build-time
           constants become serial loops (with a note). On targets without warp
           specialization (one stream of ``threads`` threads) a ``StreamPlan``: ``num_warps``
           (threads // 32, rounded down to a power of two on ``config.caps.power_of_two_tiles``, which
           are Triton's targets; a note if that changed it), ``padded_tiles`` on the same targets
           (every on-chip buffer, ``T.Parallel`` nest and copied tile of any extent is a tensor of
           the next power of two, its padding kept zero: ``StreamPlan.tile``),
           ``wide_offsets`` (the global buffers, parameters or ``T.make_tensor`` views, that may
           hold 2**31 elements or more: a static shape that large, or any runtime dim; their
           offsets need 64 bits), and on
           ``config.caps.triton_interpreter`` also ``constant_scalar_params`` (scalar parameters are
           compile-time constants, which costs nothing there), ``python_ints`` (integers that are
           no tensors there, those and loop indices, are Python's exact ints: the emitter wraps
           their arithmetic to its type), ``loops_as_while`` (its ``for``
           cannot iterate to a bound held in a tensor) and ``f32_values`` bfloat16 and the FP8
           types (its arithmetic, comparisons and conversions of these are wrong: values are held
           in float32, rounded to the type after each operation, which gives the type's IEEE
           results, and converted from and to their bits by tilews, as torch's ``.to`` does);
           ``passed_params``: the parameters the kernel's body names (a buffer, a scalar, a dim of
           a named buffer), in order, the others not passed at launch (each kernel of a function
           of several takes the function's parameters; a combine kernel reads 3 of 7 buffers).
Preserves: program meaning and every node's loc; nothing else changes (the interpret and hopper
           targets get only the mechanisms, ``mask_low``, instructions and unroll rule above).
"""
from __future__ import annotations

import dataclasses
import os
from typing import Optional

from .. import ir
from ..plans import StreamPlan
from ..config import BackendConfig
from ..traverse import transform, walk

Interval = Optional[tuple[int, int]]
HUGE = 1 << 64   # an upper bound known only to be finite (above every index a kernel computes)
# the element types whose values Triton's CPU interpreter computes with wrongly (StreamPlan.f32_values)
_CPU_F32_VALUES = (ir.DType.BF16, ir.DType.F8E4M3, ir.DType.F8E5M2)


def run(kernel: ir.Kernel, config: BackendConfig) -> ir.Kernel:
    env = {d: (0, HUGE) for b in kernel.buffer_params for d in b.shape if isinstance(d, ir.Var)}
    env.update({v: _span(g) for v, g in zip(kernel.block_vars, kernel.grid)})
    notes: list[str] = []
    body = _Decide(config, notes).seq(kernel.body, env)
    kernel = dataclasses.replace(kernel, body=body)
    for n in notes:
        kernel = kernel.with_note(n)
    if not config.caps.warp_specialization:
        kernel = _stream_plan(kernel, config)
    return kernel


def _span(extent: ir.Expr) -> Interval:
    n = ir.as_int(extent)
    return (0, HUGE) if n is None else (0, n - 1)


def _stream_plan(kernel: ir.Kernel, config: BackendConfig) -> ir.Kernel:
    warps = kernel.threads // 32
    n = 1 << (warps.bit_length() - 1) if config.caps.power_of_two_tiles else warps
    views = tuple(s.buffer for s in walk(kernel.body) if isinstance(s, ir.PointerView))
    wide = tuple(b.name for b in kernel.buffer_params + views if _may_hold_2_31(b))
    cpu = config.caps.triton_interpreter
    kernel = kernel.with_plan(StreamPlan(num_warps=n, constant_scalar_params=cpu, python_ints=cpu,
                                         loops_as_while=cpu,
                                         wide_offsets=wide, padded_tiles=config.caps.power_of_two_tiles,
                                         f32_values=_CPU_F32_VALUES if cpu else (),
                                         passed_params=_named_params(kernel)))
    if n != warps:
        kernel = kernel.with_note(f"legalize: threads={kernel.threads} is {warps} warps; one stream "
                                  f"runs num_warps={n} (a power of two)")
    return kernel


def _named_params(kernel: ir.Kernel) -> tuple[str, ...]:
    """The parameters the kernel's body names: buffers, scalars, and the dims of named buffers."""
    names: set[str] = set()

    def see(n):
        if isinstance(n, ir.Buffer):
            names.add(n.name)
            names.update(d.name for d in n.shape if isinstance(d, ir.Var))
        elif isinstance(n, ir.Var):
            names.add(n.name)
        return None
    transform(kernel.body, see)
    return tuple(p.name for p in kernel.params if p.name in names)


def _may_hold_2_31(b: ir.Buffer) -> bool:
    """Whether ``b`` may have 2**31 elements or more (a runtime dim may be anything)."""
    n = 1
    for d in b.shape:
        if ir.as_int(d) is None:
            return True
        n *= ir.as_int(d)
    return n >= 1 << 31


# ----------------------------------------------------------------------------------------------
# per-statement decisions


class _Decide:
    """Rebuilds statements with their decisions; ``env`` maps variables to value intervals."""

    def __init__(self, config: BackendConfig, notes: list[str]):
        self.config = config
        self.notes = notes

    def seq(self, s: ir.Seq, env: dict) -> ir.Seq:
        return dataclasses.replace(s, stmts=tuple(self.stmt(t, env) for t in s.stmts))

    def stmt(self, s: ir.Stmt, env: dict) -> ir.Stmt:
        s = _mask_low(s, env)
        if isinstance(s, ir.Copy):
            inside = all(self._in_bounds(r, env) for r in (s.src, s.dst))
            mech = ir.CopyMechanism.DIRECT if inside else ir.CopyMechanism.MASKED
            return dataclasses.replace(s, mechanism=mech)
        if isinstance(s, ir.Gemm):
            narrow = s.a.buffer.dtype.is_float and s.a.buffer.dtype.bits < 32
            f32 = self.config.caps.triton_interpreter and narrow
            instr = ir.GemmInstr.DOT_F32_OPERANDS if f32 else ir.GemmInstr.DOT
            return dataclasses.replace(s, instr=instr)
        if isinstance(s, ir.For):
            return self._loop(s, env)
        if isinstance(s, ir.Parallel):
            inner = {**env, **{v: (0, e - 1) for v, e in zip(s.vars, s.extents)}}
            return dataclasses.replace(s, body=self.seq(s.body, inner))
        if isinstance(s, ir.If):
            return dataclasses.replace(s, then=self.seq(s.then, env), orelse=self.seq(s.orelse, env))
        if isinstance(s, ir.Role):
            return dataclasses.replace(s, body=self.seq(s.body, env))
        if isinstance(s, ir.WarpSpecialize):
            return dataclasses.replace(s, roles=tuple(self.stmt(r, env) for r in s.roles))
        return s

    def _loop(self, s: ir.For, env: dict) -> ir.For:
        kind = s.kind
        if kind is ir.ForKind.UNROLL and any(ir.as_int(x) is None for x in (s.start, s.stop, s.step)):
            kind = ir.ForKind.SERIAL
            where = f"{os.path.basename(s.loc.file)}:{s.loc.line}"
            self.notes.append(f"legalize: T.unroll at {where} has bounds known only at run time; it "
                              f"runs as a serial loop")
        start, stop, step = (_interval(x, env) for x in (s.start, s.stop, s.step))
        span = None
        if start and step and step[0] > 0:
            span = (start[0], max(start[0], stop[1] - 1) if stop else HUGE)
        inner = {**env, s.var: span}
        return dataclasses.replace(s, kind=kind, body=self.seq(s.body, inner))

    def _in_bounds(self, r: ir.Region, env: dict) -> bool:
        if r.buffer.scope is not ir.Scope.GLOBAL:
            return True
        for start, extent, dim in zip(r.starts, r.extents, r.buffer.shape):
            span, n = _interval(start, env), ir.as_int(dim)
            if span is None or n is None or span[0] < 0 or span[1] + extent > n:
                return False
        return True


def _mask_low(s: ir.Stmt, env: dict) -> ir.Stmt:
    """``s`` with ``mask_low`` decided on the global accesses it makes itself (the expressions and
    regions of its own fields; nested bodies are decided with their own ``env``)."""
    def decide(n):
        if isinstance(n, (ir.Region, ir.Load, ir.Store)) and n.buffer.scope is ir.Scope.GLOBAL:
            starts = n.starts if isinstance(n, ir.Region) else n.indices
            spans = [_interval(i, env) for i in starts]
            return dataclasses.replace(n, mask_low=tuple(x is None or x[0] < 0 for x in spans))
        return None
    changes = {}
    for f in dataclasses.fields(s):
        v = getattr(s, f.name)
        if isinstance(v, ir.Stmt) or isinstance(v, tuple) and any(isinstance(x, ir.Stmt) for x in v):
            continue
        new = transform(v, decide)
        if new is not v:
            changes[f.name] = new
    s = dataclasses.replace(s, **changes) if changes else s
    return decide(s) or s


def _interval(e: ir.Expr, env: dict) -> Interval:
    """Bounds [lo, hi] of an integer expression over ``env``'s variable intervals, or None."""
    if isinstance(e, ir.Const):
        return None if isinstance(e.value, float) else (int(e.value), int(e.value))
    if isinstance(e, ir.Var):
        return env.get(e)
    if isinstance(e, ir.Call) and e.fn in (ir.MathFn.MIN, ir.MathFn.MAX):
        parts = [_interval(a, env) for a in e.args]
        if None in parts:
            return None
        pick = min if e.fn is ir.MathFn.MIN else max
        return pick(p[0] for p in parts), pick(p[1] for p in parts)
    if not isinstance(e, ir.BinOp) or e.dtype.is_float:
        return None
    a, b = _interval(e.a, env), _interval(e.b, env)
    if e.op is ir.BinOpKind.MOD and b is not None and b[0] == b[1] and b[0] > 0:
        return 0, b[0] - 1
    if a is None or b is None:
        return None
    if e.op is ir.BinOpKind.ADD:
        return a[0] + b[0], a[1] + b[1]
    if e.op is ir.BinOpKind.SUB:
        return a[0] - b[1], a[1] - b[0]
    if e.op is ir.BinOpKind.MUL:
        corners = [x * y for x in a for y in b]
        return min(corners), max(corners)
    if e.op is ir.BinOpKind.FLOORDIV and b[0] == b[1] and b[0] > 0:
        return a[0] // b[0], a[1] // b[0]
    return None
