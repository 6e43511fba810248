"""A loop body's repeated invariant scalars, each spelled once per iteration at the body's top.

A persistent kernel's statements all read the tile's coordinates (``persist`` put the tile's
arithmetic, divisions by the grid's extents with their floor corrections, in place of every block
index), and a pipelined loop's read the same iteration offsets many times: spelled in full at
each use, the source held each computation dozens of times, and Triton's code generator (which
visits a loop body twice, once to find what it carries, so an inner loop's body four times)
built each of them before its CSE folded them again; attention's cold compile spent about as long
there as in LLVM. The kernel Triton compiles is the same: its TTGIR after CSE, and so its PTX,
do not change.

``named(ctx, loop)`` names, at the top of ``loop``'s body, every expression the body reads more
than once that is an integer or boolean computation of variables the body does not bind (block
indices, parameters, enclosing loops' indices, this loop's own), reading memory only from global
buffers the kernel never writes (``ctx.read_only``: a varlen sequence's bounds in
``cu_seqlens``, which its loops read at every K/V block otherwise; such a load is masked, so
evaluated where a branch might not have, it cannot fault, and it reads the value the branch
would have: no other argument shares its memory, since the binder refuses a written tensor that
overlaps another argument). An integer division by zero does not trap on the GPU (PTX: an
unspecified value), so a division by a runtime value evaluated where its branch would not have
been taken yields a value nothing reads (a persistent varlen tile's sequence, the tile index
over the tiles per sequence, is such a division). One operation (``k % 3``) stays where it is
read: naming it would save one operation per use and cost the source its readability. Inner
ones first, so an outer one's spelling uses them; the names hold for the body only
(``ctx.named``, read by ``exprs.spell``).
"""
from __future__ import annotations

from contextlib import contextmanager

from tilews.lowering import ir
from tilews.lowering.traverse import exprs_of, subexprs, walk

from .context import Ctx
from .exprs import temporaries

_COMPUTED = (ir.BinOp, ir.Cmp, ir.UnOp, ir.Call, ir.Select, ir.Cast)


@contextmanager
def named(ctx: Ctx, loop: ir.For):
    """Spell ``loop.body``'s repeated invariant scalars into temporaries (lines at the current
    indentation) that ``spell`` reads until the body is spelled."""
    # (a loop inside T.Parallel is spelled per element: its scalars stay where they are read)
    with temporaries(ctx, _repeated(loop.body, ctx.named, ctx.read_only) if ctx.par is None else []):
        yield


def _repeated(body: ir.Seq, outside: dict, read_only: frozenset) -> list[ir.Expr]:
    """The invariant computations ``body`` reads more than once, not named outside it
    (``read_only``: the global buffers whose elements they may read)."""
    stmts = list(walk(body))
    bound = {t.var for t in stmts if isinstance(t, ir.For)}
    bound |= {v for t in stmts if isinstance(t, ir.Parallel) for v in t.vars}
    seen: dict[ir.Expr, int] = {}
    for t in stmts:
        for e in exprs_of(t):
            for x in subexprs(e):
                if isinstance(x, (*_COMPUTED, ir.Load)):
                    seen[x] = seen.get(x, 0) + 1
    return [x for x, n in seen.items()
            if n > 1 and x not in outside and _invariant(x, bound, read_only)]


def _invariant(e: ir.Expr, bound: set, read_only: frozenset) -> bool:
    if not (e.dtype.is_int or e.dtype is ir.DType.BOOL):
        return False
    has_var, ops, loads = False, 0, False
    for x in subexprs(e):
        if isinstance(x, ir.Var):
            if x in bound or x.kind in (ir.VarKind.PARALLEL, ir.VarKind.THREAD):
                return False
            has_var = True
        elif isinstance(x, ir.Load):
            if x.buffer not in read_only:
                return False
            loads = True
        elif not isinstance(x, (ir.Const, *_COMPUTED)):
            return False
        ops += isinstance(x, _COMPUTED)
    return loads or has_var and ops > 1
