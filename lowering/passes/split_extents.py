"""split_extents: cut on-chip tiles whose extents are not powers of two into power-of-two pieces,
so Gluon's shared layouts, register tensors and TMA boxes can hold them at their real size
(head dim 192 = 128 + 64 runs as wgmma N 128 and 64, not padded to 256).

Requires:  a verified kernel (frontend IR; before plan_pipeline, so the pieces are what gets
           pipelined, warp-specialized and legalized).
Ensures:   A *split dim* is a dim of an on-chip buffer (a shared buffer's last two dims, any dim of
           a fragment) whose extent is not a power of two, together with every on-chip dim it is
           tied to: the matching dims of a copy's (or a tile atomic's) two regions, a gemm's K dims
           (A's and B's) and N dims (B's and C's), a reduction's kept dims, the dims a
           ``T.Parallel`` variable indexes. Its extent ``n`` is cut into its binary pieces,
           largest first (192 = 128 + 64, 96 = 64 + 32, 576 = 512 + 64); each buffer with a split
           dim becomes one buffer per piece (``<name>_<offset>``, the piece's extent along the
           dim), and every statement touching it runs once per piece, in order:
           * copies, fills and tile atomics (``T.atomic_add`` of a tile, whose destination is
             global): one per segment of the cut points of both regions, global starts shifted by
             the segment's offset (a tile atomic's pieces keep its memory order);
           * gemms: one per (N segment, K segment), N outer; a split K accumulates into the same C,
             only the first keeps ``clear_accum``;
           * reductions along a split dim: the first piece as written, later pieces with
             ``clear=False`` (max/min/sum and their abs forms combine exactly); along another dim,
             piece by piece; cumulative sums likewise, never along a split dim;
           * ``T.Parallel`` loops: one loop per segment of a variable indexing a split dim, the
             variable shifted by the segment's offset wherever it is not the index of a piece;
             each loop after the first with variables of fresh names (``<name>_<n>``, the n-th):
             infer_layouts keys a loop's layout by its first variable's name, so a piece sharing
             the first's names would run in the first piece's layout;
           * element accesses at a constant index: the piece holding it.
           The program is left unchanged (legalize_wgmma then refuses it with its own reason, and
           the ``tl`` backend compiles it) when some split would be unusable: a gemm M dim (the
           rows split_consumers divides among warp groups), a gemm K piece shorter than wgmma's k
           step or an N piece shorter than 8, a buffer with two split dims, a region or loop
           segment that does not start at a piece boundary of its buffer or is no power of two, a
           cumulative sum along a split dim, an element access at an index that is neither a
           ``T.Parallel`` variable plus a constant nor a constant.
           A note names the buffers split (or what kept the program whole).
Preserves: program meaning (interpreter before == after) and every node's loc (pieces carry the
           loc of the statement or buffer they come from).
"""
from __future__ import annotations

import dataclasses
import itertools
from typing import Optional

from .. import ir
from ..config import BackendConfig
from ..simplify import difference, fold, shifted
from ..traverse import exprs_of, fresh_name, subexprs, transform, walk

_SPLITTABLE = (ir.Scope.SHARED, ir.Scope.FRAGMENT)


class _Whole(Exception):
    """The program stays unsplit; the message says why."""


@dataclasses.dataclass(frozen=True)
class _Split:
    """A buffer cut along ``dim`` into ``pieces`` (offset, buffer), in order."""
    dim: int
    pieces: tuple[tuple[int, ir.Buffer], ...]

    def piece_at(self, lo: int, hi: int) -> tuple[int, ir.Buffer]:
        """The piece holding positions [lo, hi) of the dim; _Whole if none holds them all."""
        for offset, b in self.pieces:
            if offset <= lo and hi <= offset + b.static_shape[self.dim]:
                return offset, b
        raise _Whole(f"positions {lo}..{hi - 1} of dim {self.dim} straddle two pieces")

    @property
    def cuts(self) -> tuple[int, ...]:
        return tuple(o for o, _ in self.pieces[1:])


KEPT_WHOLE = "split_extents: kept whole, "
"""How the note of a program this pass leaves whole begins (legalize_wgmma repeats its reason)."""


def run(kernel: ir.Kernel, config: BackendConfig) -> ir.Kernel:
    odd = _odd_dims(kernel)
    if not odd:
        return kernel
    try:
        dims = _tied(kernel, odd)
        splits = _splits(kernel, dims)
        body = _Rewriter(splits, kernel).seq(kernel.body)
        left = sorted({n.name for n in _buffers(body) if n in splits})
        if left:
            raise _Whole(f"'{left[0]}' is used where the pass cannot cut it")
    except _Whole as why:
        return kernel.with_note(f"{KEPT_WHOLE}{why}")
    names = ", ".join(f"{b.name} ({' + '.join(str(p.static_shape[s.dim]) for _, p in s.pieces)})"
                      for b, s in splits.items())
    return dataclasses.replace(kernel, body=body).with_note(
        f"split_extents: cut into power-of-two pieces: {names}")


# ----------------------------------------------------------------------------------------------
# which dims are split


def _buffers(node) -> list[ir.Buffer]:
    found: list[ir.Buffer] = []
    transform(node, lambda n: found.append(n) if isinstance(n, ir.Buffer) else None)
    return found


def _tile_dims(b: ir.Buffer) -> range:
    n = len(b.shape)
    return range(max(0, n - 2), n) if b.scope is ir.Scope.SHARED else range(n)


def _odd_dims(kernel: ir.Kernel) -> set:
    return {(s.buffer, d) for s in walk(kernel.body) if isinstance(s, ir.Alloc)
            and s.buffer.scope in _SPLITTABLE for d in _tile_dims(s.buffer)
            if not ir.is_power_of_two(s.buffer.static_shape[d])}


def _region_dims(r: ir.Region) -> list[int]:
    """The region's dims of extent other than 1 (a copy pairs them in order)."""
    return [d for d, e in enumerate(r.extents) if e != 1]


def _gemm_dims(g: ir.Gemm) -> dict:
    """{'M'|'N'|'K': [(buffer, dim), ...]} of a gemm's operands (their last two dims)."""
    a, b, c = (len(r.buffer.shape) for r in (g.a, g.b, g.c))
    am, ak = (a - 1, a - 2) if g.transpose_a else (a - 2, a - 1)
    bk, bn = (b - 1, b - 2) if g.transpose_b else (b - 2, b - 1)
    return {"M": [(g.a.buffer, am), (g.c.buffer, c - 2)], "N": [(g.b.buffer, bn), (g.c.buffer, c - 1)],
            "K": [(g.a.buffer, ak), (g.b.buffer, bk)]}


def _tied(kernel: ir.Kernel, odd: set) -> set:
    """The odd dims and every on-chip dim tied to one (module docstring); _Whole if a gemm M dim
    is among them."""
    parent: dict = {}

    def find(x):
        while parent.setdefault(x, x) != x:
            x = parent[x]
        return x

    def tie(pairs):
        pairs = [p for p in pairs if p[0].scope in _SPLITTABLE]
        for p in pairs[1:]:
            parent[find(p)] = find(pairs[0])
    rows: list = []
    for s in walk(kernel.body):
        if isinstance(s, ir.Copy) or isinstance(s, ir.AtomicAdd) and isinstance(s.value, ir.Region):
            src = s.src if isinstance(s, ir.Copy) else s.value
            for x, y in zip(_region_dims(src), _region_dims(s.dst)):
                tie([(src.buffer, x), (s.dst.buffer, y)])
        elif isinstance(s, ir.Gemm):
            dims = _gemm_dims(s)
            tie(dims["N"])
            tie(dims["K"])
            rows += dims["M"]
        elif isinstance(s, (ir.Reduce, ir.CumSum)):
            kept = [d for d in range(len(s.src.shape)) if not isinstance(s, ir.Reduce) or d != s.dim]
            for x, y in zip(kept, range(len(s.dst.shape))):
                tie([(s.src, x), (s.dst, y)])
        elif isinstance(s, ir.Parallel):
            for v in s.vars:
                tie([(x.buffer, d) for x in _accesses(s.body) for d, e in enumerate(x.indices)
                     if difference(e, v) is not None])
    roots = {find(x) for x in odd}
    tied = {x for x in set(parent) | odd if find(x) in roots}
    for b, d in rows:
        if (b, d) in tied:
            raise _Whole(f"dim {d} of '{b.name}' ({b.static_shape[d]}) is a gemm's M dim: rows are "
                         f"not cut (split_consumers divides them among warp groups)")
    return tied


def _accesses(body: ir.Stmt) -> list:
    """Every Load and Store (as the Store) in ``body``, nested bodies included."""
    out = []
    for s in walk(body):
        if isinstance(s, ir.Store):
            out.append(s)
        out += [x for e in exprs_of(s) for x in subexprs(e) if isinstance(x, ir.Load)]
    return out


def _pieces(n: int) -> list[tuple[int, int]]:
    """(offset, extent) of the binary pieces of ``n``, largest first."""
    out, offset = [], 0
    for bit in reversed(range(n.bit_length())):
        if n >> bit & 1:
            out.append((offset, 1 << bit))
            offset += 1 << bit
    return out


def _splits(kernel: ir.Kernel, dims: set) -> dict:
    by_buffer: dict = {}
    for b, d in dims:
        if d in _tile_dims(b) and not ir.is_power_of_two(b.static_shape[d]):
            by_buffer.setdefault(b, []).append(d)
    out = {}
    for b, ds in sorted(by_buffer.items(), key=lambda x: x[0].name):
        if len(ds) > 1:
            raise _Whole(f"'{b.name}' {list(b.static_shape)} would be cut along two dims")
        d = ds[0]
        pieces = []
        for offset, extent in _pieces(b.static_shape[d]):
            shape = list(b.shape)
            shape[d] = ir.Const(extent, ir.DType.I32, b.loc)
            name = fresh_name(kernel, f"{b.name}_{offset}")
            pieces.append((offset, dataclasses.replace(b, name=name, shape=tuple(shape))))
        out[b] = _Split(d, tuple(pieces))
    return out


# ----------------------------------------------------------------------------------------------
# the rewrite


def _segments(extent: int, cuts) -> list[tuple[int, int]]:
    points = sorted({0, extent, *(c for c in cuts if 0 < c < extent)})
    return list(zip(points, points[1:]))


class _Rewriter:
    def __init__(self, splits: dict, kernel: ir.Kernel):
        self.splits = splits
        self.kernel = kernel        # the names taken (fresh loop variables)
        self.made: set[str] = set()  # and the names this rewrite made (not in ``kernel``)

    def seq(self, body: ir.Seq) -> ir.Seq:
        out: list[ir.Stmt] = []
        for s in body.stmts:
            out.extend(self.stmt(s))
        return dataclasses.replace(body, stmts=tuple(out))

    def stmt(self, s: ir.Stmt) -> list[ir.Stmt]:
        if isinstance(s, ir.Alloc) and s.buffer in self.splits:
            return [ir.Alloc(b, s.loc) for _, b in self.splits[s.buffer].pieces]
        if isinstance(s, ir.For):
            return [dataclasses.replace(s, start=self.scalar(s.start), stop=self.scalar(s.stop),
                                        body=self.seq(s.body))]
        if isinstance(s, ir.Role):
            return [dataclasses.replace(s, body=self.seq(s.body))]
        if isinstance(s, ir.If):
            return [dataclasses.replace(s, cond=self.scalar(s.cond), then=self.seq(s.then),
                                        orelse=self.seq(s.orelse))]
        if isinstance(s, ir.WarpSpecialize):
            return [dataclasses.replace(s, roles=tuple(self.stmt(r)[0] for r in s.roles))]
        if isinstance(s, ir.Copy):
            return self.copy(s)
        if isinstance(s, ir.Fill):
            return [dataclasses.replace(s, dst=dst, value=self.scalar(s.value))
                    for dst, in self.regions(s.dst)]
        if isinstance(s, ir.Gemm):
            return self.gemm(s)
        if isinstance(s, (ir.Reduce, ir.CumSum)):
            return self.reduce(s)
        if isinstance(s, ir.Parallel):
            return self.parallel(s)
        if isinstance(s, ir.AtomicAdd) and isinstance(s.value, ir.Region):
            return [dataclasses.replace(s, value=value, dst=dst)
                    for value, dst in self.regions(s.value, s.dst)]
        return [self.scalar(s)]

    # regions ----------------------------------------------------------------------------------

    def regions(self, *rs: ir.Region) -> list[tuple[ir.Region, ...]]:
        """``rs`` (regions of equal tile shape) cut into segments along their split dims."""
        paired = [_region_dims(r) for r in rs]
        if len({len(p) for p in paired}) != 1:
            if any(r.buffer in self.splits for r in rs):
                raise _Whole(f"the regions at line {rs[0].loc.line} have different tile shapes")
            return [rs]
        cuts: list[set] = [set() for _ in paired[0]]
        for r, dims in zip(rs, paired):
            for i, d in enumerate(dims):
                cuts[i] |= self.cuts(r, d)
        per_dim = [_segments(rs[0].extents[d], c) for d, c in zip(paired[0], cuts)]
        return [tuple(self.region(r, dims, seg) for r, dims in zip(rs, paired))
                for seg in itertools.product(*per_dim)]

    def region(self, r: ir.Region, dims: list[int], seg) -> ir.Region:
        """``r`` restricted to ``seg[i]`` (offsets into the region) along ``dims[i]``, on the
        piece of its buffer holding it."""
        starts, extents = list(r.starts), list(r.extents)
        for d, (lo, hi) in zip(dims, seg):
            starts[d] = shifted(starts[d], lo)
            extents[d] = hi - lo
        sp = self.splits.get(r.buffer)
        if sp is None:
            return dataclasses.replace(r, starts=tuple(starts), extents=tuple(extents))
        at = ir.as_int(starts[sp.dim])
        if at is None:
            raise _Whole(f"'{r.buffer.name}' is accessed at a runtime offset along its cut dim "
                         f"(line {r.loc.line})")
        offset, piece = sp.piece_at(at, at + extents[sp.dim])
        starts[sp.dim] = ir.Const(at - offset, ir.DType.I32, r.loc)
        return dataclasses.replace(r, buffer=piece, starts=tuple(starts), extents=tuple(extents))

    def cuts(self, r: ir.Region, d: int) -> set:
        """The piece boundaries of ``r``'s buffer along its dim ``d``, as offsets into ``r``."""
        sp = self.splits.get(r.buffer)
        if sp is None or sp.dim != d:
            return set()
        start = ir.as_int(r.starts[d])
        if start is None:
            raise _Whole(f"'{r.buffer.name}' is accessed at a runtime offset along its cut dim "
                         f"(line {r.loc.line})")
        return {c - start for c in (0, *sp.cuts)}

    # statements -------------------------------------------------------------------------------

    def copy(self, s: ir.Copy) -> list[ir.Stmt]:
        return [dataclasses.replace(s, src=src, dst=dst) for src, dst in self.regions(s.src, s.dst)]

    def gemm(self, g: ir.Gemm) -> list[ir.Stmt]:
        if not any(r.buffer in self.splits for r in (g.a, g.b, g.c)):
            return [g]
        dims = _gemm_dims(g)
        (_, ak), (_, bk) = dims["K"]
        (_, bn), (_, cn) = dims["N"]
        n_segs = _segments(g.c.extents[cn], self.cuts(g.b, bn) | self.cuts(g.c, cn))
        k_segs = _segments(g.a.extents[ak], self.cuts(g.a, ak) | self.cuts(g.b, bk))
        step = 256 // g.a.buffer.dtype.bits
        if any(hi - lo < step for lo, hi in k_segs) or any(hi - lo < 8 for lo, hi in n_segs):
            raise _Whole(f"a piece of T.gemm at line {g.loc.line} would be smaller than a wgmma "
                         f"instruction (K {step}, N 8)")
        out = []
        for n in n_segs:
            for i, k in enumerate(k_segs):
                out.append(dataclasses.replace(
                    g, a=self.cut(g.a, {ak: k}), b=self.cut(g.b, {bk: k, bn: n}), c=self.cut(g.c, {cn: n}),
                    clear_accum=g.clear_accum if i == 0 else False))
        return out

    def cut(self, r: ir.Region, segs: dict) -> ir.Region:
        """``r`` restricted to the segment ``segs[d]`` of each dim ``d`` given."""
        dims = sorted(segs)
        return self.region(r, dims, [segs[d] for d in dims])

    def reduce(self, s) -> list[ir.Stmt]:
        src, dst = self.splits.get(s.src), self.splits.get(s.dst)
        if src is None and dst is None:
            return [s]
        along = isinstance(s, ir.Reduce) and src is not None and src.dim == s.dim
        if isinstance(s, ir.CumSum) and src is not None and src.dim == s.dim:
            raise _Whole(f"the cumulative sum at line {s.loc.line} runs along a cut dim")
        if along:
            if dst is not None:
                raise _Whole(f"'{s.dst.name}' and '{s.src.name}' are both cut (line {s.loc.line})")
            return [dataclasses.replace(s, src=b, clear=s.clear if i == 0 else False)
                    for i, (_, b) in enumerate(src.pieces)]
        if src is None or dst is None or [o for o, _ in src.pieces] != [o for o, _ in dst.pieces]:
            raise _Whole(f"'{s.src.name}' and '{s.dst.name}' are not cut alike (line {s.loc.line})")
        return [dataclasses.replace(s, src=a, dst=b) for (_, a), (_, b) in zip(src.pieces, dst.pieces)]

    def parallel(self, p: ir.Parallel) -> list[ir.Stmt]:
        per_var = []
        for v, extent in zip(p.vars, p.extents):
            cuts = set()
            for x in _accesses(p.body):
                sp = self.splits.get(x.buffer)
                shift = None if sp is None else difference(x.indices[sp.dim], v)
                if shift is not None:
                    cuts.update(c - shift for c in (0, *sp.cuts))
            segs = _segments(extent, cuts)
            if len(segs) > 1 and any(not ir.is_power_of_two(hi - lo) for lo, hi in segs):
                raise _Whole(f"the T.Parallel at line {p.loc.line} would run segments of "
                             f"{[hi - lo for lo, hi in segs]} along '{v.name}', not powers of two")
            per_var.append(segs)
        out = []
        for n, seg in enumerate(itertools.product(*per_var)):
            shifts = {v: lo for v, (lo, _) in zip(p.vars, seg)}
            extents = {v: hi - lo for v, (lo, hi) in zip(p.vars, seg)}
            body = ir.Seq(tuple(self.scalar(t, shifts, extents) for t in p.body.stmts), p.body.loc)
            piece = dataclasses.replace(p, extents=tuple(extents.values()), body=body)
            out.append(self.renamed(piece, n) if n else piece)
        return out

    def renamed(self, p: ir.Parallel, n: int) -> ir.Parallel:
        """Loop ``p`` with variables of fresh names, ``<name>_<n>`` (or that with a suffix: names
        the kernel has or this rewrite made, e.g. for a loop of ``i`` and one of ``i_1``, are
        taken)."""
        fresh = {}
        for v in p.vars:
            fresh[v] = dataclasses.replace(v, name=fresh_name(self.kernel, f"{v.name}_{n}", self.made))
            self.made.add(fresh[v].name)
        return dataclasses.replace(p, vars=tuple(fresh.values()), body=transform(
            p.body, lambda x: fresh.get(x) if isinstance(x, ir.Var) else None))

    def scalar(self, node, shifts: Optional[dict] = None, extents: Optional[dict] = None):
        """``node`` (an expression or a statement without nested bodies of its own to cut) with
        the parallel variables of ``shifts`` moved by their segment's offset, then each element
        access of a cut buffer sent to its piece (``extents``: the segment's extent per
        variable)."""
        shifts = {v: lo for v, lo in (shifts or {}).items() if lo}
        if shifts:
            node = transform(node, lambda n: shifted(n, shifts[n]) if isinstance(n, ir.Var)
                             and n in shifts else None)
        return transform(node, lambda n: self.access(n, extents or {}) if isinstance(
            n, (ir.Load, ir.Store)) and n.buffer in self.splits else None)

    def access(self, n, extents: dict):
        """The Load or Store ``n`` of a cut buffer, on the piece holding every position its index
        along the cut dim takes (a constant, or a parallel variable of ``extents`` plus one)."""
        sp = self.splits[n.buffer]
        e = n.indices[sp.dim]
        at, var = ir.as_int(fold(e)), None
        if at is not None:
            lo, hi = at, at + 1
        else:
            var = next((v for v in extents if difference(e, v) is not None), None)
            if var is None:
                raise _Whole(f"'{n.buffer.name}' is accessed at an index along its cut dim that is "
                             f"neither a constant nor a T.Parallel variable plus one (line {n.loc.line})")
            lo = difference(e, var)
            hi = lo + extents[var]
        offset, piece = sp.piece_at(lo, hi)
        index = ir.Const(lo - offset, ir.DType.I32, e.loc) if var is None else shifted(var, lo - offset)
        indices = n.indices[:sp.dim] + (index,) + n.indices[sp.dim + 1:]
        return dataclasses.replace(n, buffer=piece, indices=indices)
