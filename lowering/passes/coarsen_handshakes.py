"""coarsen_handshakes: an explicit ``T.ws`` handshake loop whose gemms step through K in tiles of
fewer than 128 bytes a row takes f consecutive k tiles per iteration, so each hand-over (two
barrier waits, two arrivals, the consumer warp groups' own sync) carries f times the MMA work.

Requires:  the source form of an explicit program, as ``ring_handshakes`` reads it; before it.
Ensures:   a loop that ``ring_handshakes.handshake`` accepts (a producer P filling the shared
           buffers X, a consumer C reading them, one pair of single barriers F / E), with a static
           start s, step d and trip count n, where

             * every statement of P touching X is a copy of a global box into the whole of one
               buffer of X, box and buffer of the same shape, and every statement of C touching X
               a gemm of two whole buffers of X into an accumulator, neither clearing it
               (``clear_accum``, ``clear_if``);
             * each buffer of X is an operand of those gemms along one K dim (A's columns or B's
               rows, as transposed), every gemm steps through K by the same k elements of one
               element width w, and f = 128 // (k * w) > 1 divides n;
             * each copy's box moves along that dim by exactly its extent per iteration
               (``start(ko + d) - start(ko)`` is the extent) and along no other dim, and the loop
               variable appears nowhere else but in the two waits' parities;
             * the wider buffers fit shared memory in a ring of ``RING_STAGES`` slots (or as many
               as the coarse loop has iterations) after the passes up to plan_buffers;

           becomes the loop ``for ko in range(n // f)``: each buffer of X f times as wide along its
           K dim, each copy of P one box f times as wide starting where iteration ``s + f * d *
           ko`` started, each gemm over the whole wider buffers, P waiting E with parity
           ``(ko + 1) % 2`` and C waiting F with ``ko % 2`` (the handshake ``ring_handshakes``
           then rings). A note on the kernel says so, or why a loop of that form was kept.
           Anything else: unchanged.
Preserves: program meaning up to the order of the accumulator's float32 additions: the gemm of
           iteration ko sums the same products as the f gemms of iterations f * ko .. f * ko + f
           - 1 did (the boxes side by side are the same global elements, out-of-bounds elements
           zero in both forms), and the handshake still orders each fill after the previous
           release and each gemm after its fill. Locations.
"""
from __future__ import annotations

import dataclasses
from typing import Optional

from .. import ir, protocol
from ..config import BackendConfig
from ..simplify import difference, fold
from ..traverse import exprs_of, subexprs, substmts, touched, transform, walk
from . import plan_buffers, ring_handshakes

ROW_BYTES = 128
"""The K width a coarsened step reaches: wgmma reads shared tiles in rows of up to 128 bytes
(its widest swizzle), and TMA fills a 128-byte row in one box. Narrower k tiles (32 fp16
elements: 64 bytes) halve the MMA work per hand-over; at 128x128x32 the seed's explicit GEMM ran
at 0.64x cuBLAS on an H200, coarsened to 64-wide k tiles at 0.93x (docs/performance.md, "What
users write")."""


def run(kernel: ir.Kernel, config: BackendConfig) -> ir.Kernel:
    for loop in [s for s in kernel.body.stmts if isinstance(s, ir.For)]:
        hs = ring_handshakes.handshake(kernel, loop)
        plan = _plan(hs) if hs is not None else None
        if plan is not None:
            kernel = _coarsened_if_fits(kernel, hs, *plan, config)
    return kernel


def _coarsened_if_fits(kernel: ir.Kernel, hs, factor: int, k_dims: dict,
                       config: BackendConfig) -> ir.Kernel:
    coarse, loop = _coarsened(kernel, hs, factor, k_dims)
    wide = ring_handshakes.handshake(coarse, loop)
    trips = protocol.loop_range(loop, {})[2]
    stages = min(ring_handshakes.RING_STAGES, trips)
    need = plan_buffers.peak_after("ring_handshakes",
                                   ring_handshakes.ringed(coarse, wide, stages), config)
    names = ", ".join(b.name for b in hs.buffers)
    what = (f"coarsen_handshakes: the loop at line {hs.loop.loc.line} hands {names} over "
            f"{factor} k tiles at a time")
    if need > config.caps.smem_bytes:
        return kernel.with_note(
            f"coarsen_handshakes: the loop at line {hs.loop.loc.line} keeps its k tiles: "
            f"{factor} at a time in a ring of {stages} slots would need {need} bytes of shared "
            f"memory, more than the {config.caps.smem_bytes} of target '{config.name}'")
    return coarse.with_note(
        f"{what} ({ROW_BYTES}-byte rows along K: {trips} iterations instead of "
        f"{trips * factor}, each gemm over the {factor} tiles the producer loads as one box)")


def _plan(hs) -> Optional[tuple[int, dict]]:
    """(f, {buffer of X: its K dim}) where ``hs``'s loop has the contract's form, else None."""
    start, step, trips = protocol.loop_range(hs.loop, {})
    if None in (start, step, trips):
        return None
    ring = set(hs.buffers)
    leaves = [s for s in walk(hs.loop.body) if not substmts(s)]
    gemms = [s for s in leaves if isinstance(s, ir.Gemm) and touched(s) & ring]
    copies = [s for s in leaves if isinstance(s, ir.Copy) and touched(s) & ring]
    if not gemms or len(gemms) + len(copies) != sum(1 for s in leaves if touched(s) & ring):
        return None
    k_dims: dict = {}
    for g in gemms:
        if g.clear_accum or g.clear_if is not None \
                or not (g.a.buffer in ring and g.b.buffer in ring and g.a.is_whole and g.b.is_whole):
            return None
        for buf, dim in ((g.a.buffer, 0 if g.transpose_a else 1), (g.b.buffer, 1 if g.transpose_b else 0)):
            if k_dims.setdefault(buf, dim) != dim:
                return None
    if set(k_dims) != ring:
        return None
    widths = {b.static_shape[k_dims[b]] * b.dtype.itemsize for g in gemms for b in (g.a.buffer, g.b.buffer)}
    factor = ROW_BYTES // widths.pop() if len(widths) == 1 else 0
    if factor < 2 or trips % factor or trips // factor < 2:
        return None
    if not all(_steps_along_k(c, k_dims, hs.loop, step) for c in copies):
        return None
    # the loop variable: in the boxes' K starts just checked and the waits' parities only
    moving = {id(c.src.starts[k_dims[c.dst.buffer]]) for c in copies}
    rest = [e for s in leaves if not isinstance(s, ir.BarrierWait)
            for e in exprs_of(s) if id(e) not in moving]
    if any(hs.loop.var == t for e in rest for t in subexprs(e)):
        return None
    return factor, k_dims


def _steps_along_k(c: ir.Copy, k_dims: dict, loop: ir.For, step: int) -> bool:
    """Whether the copy fills a whole buffer of X from a global box of its shape that moves by
    its extent along the buffer's K dim each iteration (``_plan`` checks the other dims)."""
    if c.dst.buffer not in k_dims or not c.dst.is_whole or c.src.buffer.scope is not ir.Scope.GLOBAL \
            or tuple(c.src.extents) != c.dst.buffer.static_shape:
        return False
    dim = k_dims[c.dst.buffer]
    ahead = _at(c.src.starts[dim], loop.var, ir.BinOp(ir.BinOpKind.ADD, loop.var,
                                                      ir.Const(step, ir.DType.I32, loop.loc),
                                                      ir.DType.I32, loop.loc))
    return difference(ahead, c.src.starts[dim]) == c.src.extents[dim]


def _at(e: ir.Expr, var: ir.Var, value: ir.Expr) -> ir.Expr:
    """``e`` with ``value`` for ``var``, folded."""
    return fold(transform(e, lambda n: value if n == var else None))


def _coarsened(kernel: ir.Kernel, hs, factor: int, k_dims: dict) -> tuple[ir.Kernel, ir.For]:
    """The contract's coarse form of ``kernel`` and its coarse loop."""
    loop, loc = hs.loop, hs.loop.loc
    start, step, trips = protocol.loop_range(loop, {})
    i32 = ir.DType.I32

    def c(v):
        return ir.Const(v, i32, loc)

    # iteration ko of the coarse loop starts where iteration s + f * d * ko of the loop did
    first = fold(ir.BinOp(ir.BinOpKind.ADD, c(start),
                          ir.BinOp(ir.BinOpKind.MUL, c(factor * step), loop.var, i32, loc), i32, loc))
    wide = {b: dataclasses.replace(b, shape=tuple(c(n * factor) if d == k_dims[b] else b.shape[d]
                                                  for d, n in enumerate(b.static_shape)))
            for b in hs.buffers}

    def whole(r: ir.Region) -> ir.Region:
        return ir.whole_region(wide[r.buffer], r.loc)

    def parity(ahead: int) -> ir.Expr:
        return ir.BinOp(ir.BinOpKind.MOD, fold(ir.BinOp(ir.BinOpKind.ADD, loop.var, c(ahead), i32, loc)),
                        c(2), i32, loc)

    def fn(node):
        if isinstance(node, ir.Copy) and node.dst.buffer in wide:
            dim = k_dims[node.dst.buffer]
            starts = tuple(_at(e, loop.var, first) if d == dim else e
                           for d, e in enumerate(node.src.starts))
            extents = tuple(n * factor if d == dim else n for d, n in enumerate(node.src.extents))
            src = dataclasses.replace(node.src, starts=starts, extents=extents)
            return dataclasses.replace(node, src=src, dst=whole(node.dst))
        if isinstance(node, ir.Gemm) and node.a.buffer in wide:
            return dataclasses.replace(node, a=whole(node.a), b=whole(node.b))
        if isinstance(node, ir.BarrierWait) and node.barrier.buffer in (hs.full, hs.empty):
            return dataclasses.replace(node, parity=parity(1 if node.barrier.buffer == hs.empty else 0))
        return None

    coarse = dataclasses.replace(loop, start=c(0), stop=c(trips // factor), step=c(1),
                                 body=transform(loop.body, fn))
    stmts = tuple(ir.Alloc(wide[s.buffer], s.loc) if isinstance(s, ir.Alloc) and s.buffer in wide
                  else coarse if s is loop else s for s in kernel.body.stmts)
    return dataclasses.replace(kernel, body=dataclasses.replace(kernel.body, stmts=stmts)), coarse
