"""infer_layouts: choose the layout of every fragment of a warp-specialized program, of every
``T.Parallel`` loop over fragments, and of every shared buffer a warp-group MMA or a bulk copy
reads.

Requires:  warp_specialize and plan_buffers have run; in the pipelines of backends with
           warp-group MMA (gluon).
Ensures:   a ``LayoutPlan`` whose ``layouts`` hold, by buffer name:
           * a ``WgmmaAccumulator`` for each gemm accumulator, splitting M across the warp
             groups of its role first (a merged ``T.ws(1, 2)`` consumer holds one accumulator,
             half the rows in each warp group). A tile no valid warp partition fits
             (docs/ws-semantics.md #3: M a multiple of 64 per warp group, N of 8) gets none
             (``legalize_wgmma`` refuses the program, naming the gemm and the block sizes that
             work);
           * a ``WgmmaOperandA`` (on the accumulator of its gemm) for a fragment a gemm reads as
             its A operand;
           * for the other fragments, the layout their uses imply, propagated to a fixed point:
             a whole fragment -> fragment copy keeps the layout across, a vector copied into
             a row or column of a 2-d fragment gives it the parent of its slice along that dim
             (a score column ``S[:, k]`` from a row reduction); a reduction's destination is
             the ``RowSlice`` of its source along the reduced dim (and the source the parent of a
             slice destination); inside a ``T.Parallel`` every fragment indexed by all the loop's
             variables (in order) has the loop's layout and a vector indexed by one of them the
             slice of it along that axis. Per-thread code (``Parallel(per_thread=True)`` over
             the role's threads, then at most one vector dim) runs in a ``Blocked`` layout of one
             thread per element of its thread dim and the vector dim in the thread's registers,
             and so do its 2-d per-thread locals (a thread's row of a ``(threads, n)``
             fragment). Fragments nothing constrains are ``Blocked``: 2-d ones first, one at
             a time in program order, each followed by what it implies, so a vector that a 2-d
             loop reads becomes a slice of that loop's layout rather than a ``Blocked`` vector
             converted at every use (the decode merge's row weights, converted per split
             through shared memory between two barriers); then the vectors left.
             The first layout a fragment gets is kept: a use that wants another one converts
             (the emitter spells ``convert_layout`` where a value's layout and the layout its
             use needs differ; for 16-bit P the accumulator -> operand conversion moves no data,
             tests/test_layouts.py);
           * an ``NVMMAShared`` for each shared buffer (of one stage, for rings: ``slot_shape``),
             rank 1 for vectors (block-wise FP8's ring of row scales);
           and ``frames``: per ``T.Parallel`` over fragments (by its first variable's name), the
           layout its loop indices live in — that of the first fragment it stores whole, else of
           the first it reads whole, else the parent of a vector slice it reads, else (a loop
           touching no fragment, e.g. storing to global memory only) ``Blocked``: of 16-byte
           runs of a row per thread where a 2-d loop reads a shared tile (``_plain``).
Preserves: the program.
"""
from __future__ import annotations

from typing import Iterator, Optional

from .. import ir, layouts
from ..plans import LayoutPlan, PipelinePlan, slot_shape
from ..config import BackendConfig
from ..traverse import buffers_read, buffers_written, element_accesses, walk


def run(kernel: ir.Kernel, config: BackendConfig) -> ir.Kernel:
    chosen: dict[str, object] = {}
    frames: dict[str, object] = {}
    for ws in (s for s in walk(kernel.body) if isinstance(s, ir.WarpSpecialize)):
        for role in ws.roles:
            _role_layouts(role, 4 * len(role.warpgroups), chosen, frames)
    pipeline = kernel.find_plan(PipelinePlan)
    for s in walk(kernel.body):
        if isinstance(s, ir.Alloc) and s.buffer.scope is ir.Scope.SHARED:
            tile = slot_shape(s.buffer, pipeline)
            chosen[s.buffer.name] = layouts.default_shared(tile, s.buffer.dtype.bits)
    return kernel.with_plan(LayoutPlan(tuple(sorted(chosen.items())), tuple(sorted(frames.items()))))


def _role_layouts(role: ir.Role, warps: int, chosen: dict, frames: dict) -> None:
    stmts = list(walk(role.body))
    gemms = [s for s in stmts if isinstance(s, ir.Gemm)]
    for g in gemms:
        acc = _accumulator(g, warps)
        if acc is not None:
            chosen.setdefault(g.c.buffer.name, acc)
    for g in gemms:
        if g.a.buffer.scope is ir.Scope.FRAGMENT and g.c.buffer.name in chosen:
            chosen.setdefault(g.a.buffer.name,
                              layouts.WgmmaOperandA(chosen[g.c.buffer.name], 32 // g.a.buffer.dtype.bits))
    loops = [s for s in stmts if isinstance(s, ir.Parallel)]
    for p in loops:
        if p.per_thread and p.extents[0] == 32 * warps and len(p.vars) <= 2:
            frames.setdefault(p.vars[0].name, _per_thread(p.extents, warps))
            for b, idx in (a for s in walk(p.body) for a in element_accesses(s)):
                if b.scope is ir.Scope.FRAGMENT and len(b.shape) == 2 and idx[0] == p.vars[0] \
                        and b.static_shape[0] == p.extents[0]:
                    chosen.setdefault(b.name, _per_thread(b.static_shape, warps))
    _propagate(stmts, loops, chosen, frames)
    # what nothing constrains: tiles first, each followed by what it implies, so a vector a 2-d
    # loop reads becomes a slice of that loop's layout (no conversion per use: a merge's row
    # weights, converted per split, put two barriers and an L2 round trip in each step), then
    # the vectors left
    frags = [b for s in stmts for b in _fragments(s)]
    for b in [b for b in frags if len(b.shape) >= 2] + [b for b in frags if len(b.shape) < 2]:
        if b.name not in chosen:
            chosen[b.name] = layouts.Blocked(len(b.shape), warps)
            _propagate(stmts, loops, chosen, frames)
    for p in loops:               # a loop touching no fragment runs in a plain layout
        frame = _frame(p, chosen) or _plain(p, warps)
        frames.setdefault(p.vars[0].name, frame)


def _propagate(stmts: list, loops: list, chosen: dict, frames: dict) -> None:
    """Layouts implied by those chosen, and loops' frames, to a fixed point."""
    changed = True
    while changed:
        changed = False
        for s in stmts:
            for name, layout in _implied(s, chosen, frames):
                if name not in chosen:
                    chosen[name] = layout
                    changed = True
        for p in loops:
            frame = _frame(p, chosen)
            if frame is not None and p.vars[0].name not in frames:
                frames[p.vars[0].name] = frame
                changed = True


def _plain(p: ir.Parallel, warps: int) -> layouts.Blocked:
    """The layout of a loop touching no fragment: ``Blocked``; a 2-d loop reading a shared tile
    gives each thread 16-byte runs of a row (vector loads of the tile, and coalesced vector
    stores where it stores rows of global memory: a staged tile stored under a row bound)."""
    tiles = [x for s in walk(p.body) for x, _ in element_accesses(s)
             if x.scope is ir.Scope.SHARED and len(x.shape) == 2]
    if len(p.vars) != 2 or not tiles or not ir.is_power_of_two(p.extents[1]):
        return layouts.Blocked(len(p.vars), warps)
    vector = max(1, min(p.extents[1], 16 // max(b.dtype.itemsize for b in tiles)))
    return layouts.Blocked(2, warps, vector, max(1, min(32, p.extents[1] // vector)))


def _per_thread(shape: tuple[int, ...], warps: int):
    """The layout of per-thread code over ``shape`` (a thread dim, then a vector dim): one
    thread per element of the thread dim, the vector dim in the thread's registers."""
    return layouts.Blocked(len(shape), warps, *((shape[1], 1) if len(shape) == 2 else ()))


def _fragments(s: ir.Stmt) -> Iterator[ir.Buffer]:
    for b in buffers_read(s) + buffers_written(s):
        if b.scope is ir.Scope.FRAGMENT:
            yield b


def _distributed(layout) -> bool:
    """Layouts other layouts may be derived from (not an operand layout)."""
    return not isinstance(layout, layouts.WgmmaOperandA)


def _implied(s: ir.Stmt, chosen: dict, frames: dict) -> Iterator[tuple[str, object]]:
    """(fragment, layout) pairs statement ``s`` implies from the layouts chosen so far."""
    if isinstance(s, ir.Copy) and s.src.buffer.scope is ir.Scope.FRAGMENT \
            and s.dst.buffer.scope is ir.Scope.FRAGMENT and s.src.is_whole and s.dst.is_whole \
            and s.src.tile_shape == s.dst.tile_shape:
        for a, b in ((s.src.buffer, s.dst.buffer), (s.dst.buffer, s.src.buffer)):
            if a.name in chosen and _distributed(chosen[a.name]):
                yield b.name, chosen[a.name]
    elif isinstance(s, ir.Copy) and s.src.buffer.scope is ir.Scope.FRAGMENT \
            and s.dst.buffer.scope is ir.Scope.FRAGMENT and len(s.dst.buffer.shape) == 2 \
            and len(s.src.buffer.shape) == 1:
        src = chosen.get(s.src.buffer.name)        # a vector into a row or column
        if isinstance(src, layouts.RowSlice) and s.dst.extents[src.dim] == 1:
            yield s.dst.buffer.name, src.parent
    elif isinstance(s, ir.Reduce) and s.src.scope is ir.Scope.FRAGMENT and len(s.src.shape) == 2:
        src, dst = chosen.get(s.src.name), chosen.get(s.dst.name)
        if src is not None and _distributed(src):
            yield s.dst.name, layouts.RowSlice(s.dim, src)
        if isinstance(dst, layouts.RowSlice) and dst.dim == s.dim:
            yield s.src.name, dst.parent
    elif isinstance(s, ir.Parallel):
        frame = frames.get(s.vars[0].name) or _frame(s, chosen)
        if frame is None:
            return
        for b, axis in _parallel_accesses(s):
            yield b.name, frame if axis is None else _along(frame, axis, len(s.vars))


def _along(frame, axis: int, rank: int):
    """The layout of a vector indexed by loop axis ``axis`` of a frame of ``rank`` dims."""
    return frame if rank == 1 else layouts.RowSlice(1 - axis, frame)


def _parallel_accesses(p: ir.Parallel) -> Iterator[tuple[ir.Buffer, Optional[int]]]:
    """Fragments a parallel loop touches as (buffer, None) when indexed by all its variables in
    order, or (buffer, axis) for a vector indexed by one variable."""
    for s in walk(p.body):
        for b, idx in element_accesses(s):
            if b.scope is not ir.Scope.FRAGMENT:
                continue
            if tuple(idx) == p.vars:
                yield b, None
            elif len(idx) == 1 and idx[0] in p.vars:
                yield b, p.vars.index(idx[0])


def _frame(p: ir.Parallel, chosen: dict):
    """The layout of the loop's indices (see the module docstring), or None while unknown."""
    stored = [s.buffer for s in walk(p.body) if isinstance(s, ir.Store)]
    whole = [b for b, axis in _parallel_accesses(p) if axis is None]
    for b in sorted(whole, key=lambda b: b not in stored):
        if b.name in chosen and _distributed(chosen[b.name]):
            return chosen[b.name]
    if len(p.vars) == 2:
        for b, axis in _parallel_accesses(p):
            lay = chosen.get(b.name)
            if axis is not None and isinstance(lay, layouts.RowSlice) and lay.dim == 1 - axis:
                return lay.parent
    return None


def _accumulator(g: ir.Gemm, warps: int) -> Optional[layouts.WgmmaAccumulator]:
    """The accumulator layout, or None where no wgmma warp partition fits the tile
    (``legalize_wgmma`` refuses such a gemm, saying which block sizes work)."""
    M, N = g.c.tile_shape
    try:
        return layouts.accumulator_for(M, N, warps, g.a.buffer.dtype.bits)
    except ValueError:
        return None
