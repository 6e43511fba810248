"""longest_first: blocks whose pipelined loop runs longest are launched first.

Causal attention's query block ``bx`` loops over ``bx + 1`` key blocks (TileLang's examples:
``T.ceildiv((bx + 1) * block_M, block_N)``), so in launch order the longest blocks come last and
one of them can run alone at the end of the grid. A program that writes its schedule out
(``T.ws`` roles, each looping over the key blocks with ``range``) has the same loops in its
roles. A grid launched as it stands (the ``tl`` backend, a Gluon kernel that stays one block
per tile) starts its longest blocks first and fills the tail with short ones. A persistent kernel (``persist``, which runs before this pass in the
Gluon pipeline) keeps its launch order: its serpentine rounds already share unequal tiles out
evenly, and there the backwards order measured slower (H200, causal B4 H32 S4096 D128, 5 rounds:
0.93x cuDNN numbered backwards, 1.10x in launch order; D64 equal). ``tilews.ops.attention``
leaves the order to this pass.

Requires:  a verified kernel (frontend IR, or after ``persist``) without ``block_defs``.
Ensures:   a kernel with a ``T.Persistent`` tile loop: unchanged. Otherwise, for the first
           grid dimension ``d`` (in order x, y, z) with a static extent ``g`` of 2 to
           ``MAX_EXTENT`` whose block index ``b`` the bounds of a ``T.Pipelined`` loop, or of a
           serial loop inside a ``T.ws`` role, read,
           where the iterations of every such loop are integers at each ``b`` in ``[0, g)`` once
           ``b`` is known (they read no other block index, no runtime scalar and no memory),
           their sum never falls as ``b`` grows and rises somewhere: every use of ``b`` in the
           body reads ``g - 1 - b``, and a note names the loop's line and the iteration counts
           at both ends. Anything else is unchanged.
Preserves: program meaning (``b -> g - 1 - b`` is a bijection of the dimension's blocks, which
           are independent: each former block runs once) and locations.
"""
from __future__ import annotations

import dataclasses
from typing import Optional

from .. import ir
from ..config import BackendConfig
from ..simplify import evaluate
from ..traverse import subexprs, transform, walk

MAX_EXTENT = 4096   # iteration counts are evaluated once per index: bound the compile time


def run(kernel: ir.Kernel, config: BackendConfig) -> ir.Kernel:
    if kernel.block_defs or any(isinstance(s, ir.For) and s.kind is ir.ForKind.PERSISTENT
                                for s in kernel.body.stmts):
        return kernel
    loops = [s for s in walk(kernel.body) if isinstance(s, ir.For) and s.kind is ir.ForKind.PIPELINED]
    loops += [s for role in walk(kernel.body) if isinstance(role, ir.Role)
              for s in walk(role.body) if isinstance(s, ir.For) and s.kind is ir.ForKind.SERIAL]
    for var, extent in zip(kernel.block_vars, kernel.grid):
        g = ir.as_int(extent)
        reading = [s for s in loops if any(e == var for bound in (s.start, s.stop)
                                           for e in subexprs(bound))]
        if g is None or not 2 <= g <= MAX_EXTENT or not reading:
            continue
        trips = _trips(reading, var, g)
        if trips is None or trips[-1] == trips[0] or any(a > b for a, b in zip(trips, trips[1:])):
            continue
        loc = kernel.loc
        flipped = ir.BinOp(ir.BinOpKind.SUB, ir.Const(g - 1, ir.DType.I32, loc), var, ir.DType.I32, loc)
        body = transform(kernel.body, lambda n: flipped if n == var else None)
        return dataclasses.replace(kernel, body=body).with_note(
            f"longest_first: block index {var.name} numbered backwards ({var.name} -> {g - 1} - "
            f"{var.name}): the {_kind(reading[0])} loop at line {reading[0].loc.line} runs {trips[0]} "
            f"iterations at {var.name} = 0 and {trips[-1]} at {var.name} = {g - 1}, so the longest "
            f"blocks start first")
    return kernel


def _kind(loop: ir.For) -> str:
    return "T.Pipelined" if loop.kind is ir.ForKind.PIPELINED else "role's"


def _trips(loops: list, var: ir.Var, g: int) -> Optional[list[int]]:
    """The loops' iterations summed, at each value of ``var`` in ``[0, g)``; None where one is not
    known from ``var`` alone."""
    out = []
    for b in range(g):
        total = 0
        for s in loops:
            env = {var: b}
            start, stop, step = (evaluate(e, env) for e in (s.start, s.stop, s.step))
            if None in (start, stop, step) or step <= 0:
                return None
            total += max(0, -(-(stop - start) // step))
        out.append(total)
    return out
