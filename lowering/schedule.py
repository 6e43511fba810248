"""Index arithmetic of loops, tile schedules and ring slots, built as IR (constants folded).

Shared by the frontend (``T.Persistent``) and the passes that rewrite loops, so each formula is
written once.
"""
from __future__ import annotations

from typing import Optional

from . import ir
from .simplify import fold
from .traverse import transform

_I32 = ir.DType.I32


def _op(kind: ir.BinOpKind, a: ir.Expr, b: ir.Expr, loc: ir.Loc) -> ir.BinOp:
    return ir.BinOp(kind, a, b, _I32, loc)


def _c(v: int, loc: ir.Loc) -> ir.Const:
    return ir.Const(v, _I32, loc)


def iteration(loop: ir.For, loc: ir.Loc) -> ir.Expr:
    """The 0-based iteration number of ``loop``'s index: (var - start) // step."""
    it: ir.Expr = loop.var
    if ir.as_int(loop.start) != 0:
        it = _op(ir.BinOpKind.SUB, it, loop.start, loc)
    if ir.as_int(loop.step) != 1:
        it = _op(ir.BinOpKind.FLOORDIV, it, loop.step, loc)
    return it


def trip_count(loop: ir.For, loc: ir.Loc) -> ir.Expr:
    """The number of iterations of ``loop``: ceil((stop - start) / step)."""
    span = _op(ir.BinOpKind.SUB, loop.stop, loop.start, loc)
    up = _op(ir.BinOpKind.SUB, _op(ir.BinOpKind.ADD, span, loop.step, loc), _c(1, loc), loc)
    return fold(_op(ir.BinOpKind.FLOORDIV, up, loop.step, loc))


def substitute(stmts, var: ir.Var, value: ir.Expr, counter: Optional[ir.Buffer] = None) -> tuple:
    """``stmts`` with ``var`` replaced by ``value`` (and the scalar ``counter``'s value by one
    more, if given), folded; an ``if`` whose condition folds to a constant becomes the branch
    it takes. (Passes that peel or unroll iterations of a loop.)"""
    def place(n):
        if n == var:
            return value
        if counter is not None and isinstance(n, ir.Load) and n.buffer == counter:
            return ir.BinOp(ir.BinOpKind.ADD, n, ir.Const(1, ir.DType.I32, n.loc), ir.DType.I32, n.loc)
        return None
    out: list[ir.Stmt] = []
    for t in stmts:
        t = transform(transform(t, place), lambda n: fold(n) if isinstance(n, ir.Expr) else None)
        if isinstance(t, ir.If) and isinstance(t.cond, ir.Const):
            out += (t.then if t.cond.value else t.orelse).stmts
        else:
            out.append(t)
    return tuple(out)


def guarded(loop: ir.For, stmts) -> list:
    """``stmts`` under ``if start < stop`` unless ``loop`` is known to run."""
    loc = loop.loc
    ran = fold(ir.Cmp(ir.CmpKind.LT, loop.start, loop.stop, loc))
    if ran == ir.Const(True, ir.DType.BOOL):
        return list(stmts)
    return [ir.If(ran, ir.Seq(tuple(stmts), loc), ir.Seq((), loc), loc)]


def last_index(loop: ir.For, loc: ir.Loc) -> ir.Expr:
    """The index of ``loop``'s last iteration: start + ((stop - start - 1) // step) * step."""
    span = _op(ir.BinOpKind.SUB, _op(ir.BinOpKind.SUB, loop.stop, loop.start, loc), _c(1, loc), loc)
    steps = _op(ir.BinOpKind.MUL, _op(ir.BinOpKind.FLOORDIV, span, loop.step, loc), loop.step, loc)
    return fold(_op(ir.BinOpKind.ADD, loop.start, steps, loc))


PANEL_ROWS = 16
"""Rows of tiles per panel where lowering picks the order of a 2-d grid of GEMM tiles (persist,
panel_grid): measured on H200, 16-row panels beat 8 at 4096^3."""


def grouped_tile(tile: ir.Expr, tiles_0: ir.Expr, tiles_1: ir.Expr, group: int,
                 loc: ir.Loc) -> tuple[ir.Expr, ir.Expr]:
    """Tile number -> (index along dimension 0, index along dimension 1), visiting the
    tiles_0 x tiles_1 domain in panels of ``group`` rows of dimension 0 (L2-friendly order)."""
    B = ir.BinOpKind
    width = fold(_op(B.MUL, _c(group, loc), tiles_1, loc))
    first = _op(B.MUL, _op(B.FLOORDIV, tile, width, loc), _c(group, loc), loc)
    rows = ir.Call(ir.MathFn.MIN, (_op(B.SUB, tiles_0, first, loc), _c(group, loc)), _I32, loc)
    within = _op(B.MOD, tile, width, loc)
    return (fold(_op(B.ADD, first, _op(B.MOD, within, rows, loc), loc)),
            fold(_op(B.FLOORDIV, within, rows, loc)))


def launch_order(tile: ir.Expr, extents: list, loc: ir.Loc) -> tuple[ir.Expr, ...]:
    """Tile number -> its index along each grid dimension, the first fastest (the order in which
    blocks of that grid are launched)."""
    B = ir.BinOpKind
    out, stride = [], None
    for k, g in enumerate(extents):
        q = tile if stride is None else _op(B.FLOORDIV, tile, stride, loc)
        out.append(fold(q if k == len(extents) - 1 else _op(B.MOD, q, g, loc)))
        stride = g if stride is None else fold(_op(B.MUL, stride, g, loc))
    return tuple(out)


def serpentine_tile(block: ir.Expr, it: ir.Expr, blocks: int, loc: ir.Loc) -> ir.Expr:
    """The tile block ``block`` of ``blocks`` runs at its iteration ``it`` when the blocks take
    rounds of ``blocks`` consecutive tiles, in block order in even rounds and in reverse in odd
    ones (so a block's tiles sample every position of a round alike)."""
    B = ir.BinOpKind
    odd = ir.Cmp(ir.CmpKind.EQ, _op(B.AND, it, _c(1, loc), loc), _c(1, loc), loc)
    pos = ir.Select(odd, _op(B.SUB, _c(blocks - 1, loc), block, loc), block, _I32, loc)
    return _op(B.ADD, _op(B.MUL, it, _c(blocks, loc), loc), pos, loc)


def serpentine_tiles_of_block(total: ir.Expr, block: ir.Expr, blocks: int, loc: ir.Loc) -> ir.Expr:
    """How many of ``total`` tiles (a constant, or a runtime value: a grid sized at launch) block
    ``block`` runs in ``serpentine_tile``'s order: the whole rounds, and one more where its
    position in the last, partial round is below the tiles left."""
    B = ir.BinOpKind
    rounds, left = _op(B.FLOORDIV, total, _c(blocks, loc), loc), _op(B.MOD, total, _c(blocks, loc), loc)
    odd = ir.Cmp(ir.CmpKind.EQ, _op(B.AND, rounds, _c(1, loc), loc), _c(1, loc), loc)
    pos = ir.Select(odd, _op(B.SUB, _c(blocks - 1, loc), block, loc), block, _I32, loc)
    more = ir.Select(ir.Cmp(ir.CmpKind.LT, pos, left, loc), _c(1, loc), _c(0, loc), _I32, loc)
    return fold(_op(B.ADD, rounds, more, loc))


def tiles_of_block(total: ir.Expr, block: ir.Expr, blocks: ir.Expr, loc: ir.Loc) -> ir.Expr:
    """How many of ``total`` tiles block ``block`` of ``blocks`` visits (tiles block,
    block + blocks, ...): ceil((total - block) / blocks)."""
    B = ir.BinOpKind
    up = _op(B.SUB, _op(B.ADD, _op(B.SUB, total, block, loc), blocks, loc), _c(1, loc), loc)
    return fold(_op(B.FLOORDIV, up, blocks, loc))


def ring_counter(loop: ir.For):
    """The scalar local ``loop``'s body ends by incrementing by 1 (warp_specialize's ring counter
    of a loop whose trip count varies from tile to tile), or None."""
    last = loop.body.stmts[-1] if loop.body.stmts else None
    if not (isinstance(last, ir.Store) and last.buffer.scope is ir.Scope.LOCAL):
        return None
    v = last.value
    bumped = (isinstance(v, ir.BinOp) and v.op is ir.BinOpKind.ADD and ir.as_int(v.b) == 1
              and isinstance(v.a, ir.Load) and v.a.buffer == last.buffer)
    return last.buffer if bumped else None


def flipped(parity: ir.Expr, loc: ir.Loc) -> ir.BinOp:
    """``parity ^ 1``: the phase before the one ``parity`` waits for (a wait for a slot's release,
    which passes at once on a fresh barrier)."""
    return _op(ir.BinOpKind.XOR, parity, _c(1, loc), loc)


def ring_slot(it: ir.Expr, stages: int, loc: ir.Loc) -> tuple[ir.Expr, ir.Expr]:
    """(ring slot, phase parity) of the ``it``-th use of a ring of ``stages``."""
    B = ir.BinOpKind
    return (_op(B.MOD, it, _c(stages, loc), loc),
            _op(B.AND, _op(B.FLOORDIV, it, _c(stages, loc), loc), _c(1, loc), loc))


def in_slot(node, rings: dict, slot: ir.Expr):
    """A ``transform`` callback: a region or element load of a buffer in ``rings`` (buffer -> the
    same buffer with a leading slot dimension) as the same access of slot ``slot``; else None."""
    if isinstance(node, ir.Region) and node.buffer in rings:
        return ir.Region(rings[node.buffer], (slot,) + node.starts, (1,) + node.extents, node.loc)
    if isinstance(node, ir.Load) and node.buffer in rings:
        return ir.Load(rings[node.buffer], (slot,) + node.indices, node.loc)
    return None


def restager(rings: dict, slot: ir.Expr):
    """Statement -> the statement with its accesses of ``rings``' buffers in slot ``slot``."""
    return lambda s: transform(s, lambda node: in_slot(node, rings, slot))
