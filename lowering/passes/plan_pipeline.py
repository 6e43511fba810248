"""plan_pipeline: decide which statements of a ``T.Pipelined`` loop produce and which consume.

Requires:  a verified kernel; in the pipelines of backends with
           warp-group MMA (gluon).
Ensures:   for a kernel whose body is [allocations, prelude, one pipelined loop, epilogue] — or
           [allocations, one T.Persistent tile loop whose body is [prelude, pipelined loop,
           epilogue]] — where the
           loop body — or the body of one `if` that is the whole loop body, its condition reading
           no on-chip memory (block-sparse loops) — holds global -> shared copies (the
           producers; their starts may read global memory, a varlen start ``cu_seqlens[b]``, but
           no on-chip memory) filling whole shared buffers that nothing else writes and that no statement
           of the body before the copy touches (so every copy can be issued at the start of its
           iteration, ahead of the consumers: attention's V copy after its Q K^T gemm), the
           other statements only reading them (the consumers), a ``PipelinePlan``; otherwise a
           note saying why the loop will not be warp-specialized (the program is unchanged
           either way); a kernel holding a ``PointerView`` (``T.make_tensor``) gets that note
           (its views cannot be TMA operands). The plan's ``preloads`` are the copies before the loop (in the tile
           loop's body, if any) of the same form (a global tile into a whole shared buffer that
           nothing else writes or reads before the copy), e.g. attention's Q tile.
Preserves: the program (this pass only analyses) and every node's loc.
"""
from __future__ import annotations

from typing import Optional

from .. import ir
from ..plans import PipelinePlan
from ..roles import role_sets
from ..config import BackendConfig
from ..traverse import buffers_read, buffers_written, subexprs, touched, walk


def run(kernel: ir.Kernel, config: BackendConfig) -> ir.Kernel:
    if role_sets(kernel.body):
        return kernel
    loops = [s for s in walk(kernel.body) if isinstance(s, ir.For) and s.kind is ir.ForKind.PIPELINED]
    if not loops:
        return kernel
    plan, why = _plan(kernel, loops)
    if plan is None:
        return kernel.with_note(f"plan_pipeline: T.Pipelined at line {loops[0].loc.line} is not "
                                f"warp-specialized: {why}")
    return kernel.with_plan(plan)


def _plan(kernel: ir.Kernel, loops: list[ir.For]) -> tuple[Optional[PipelinePlan], str]:
    views = [s for s in walk(kernel.body) if isinstance(s, ir.PointerView)]
    if views:
        return None, (f"T.make_tensor at line {views[0].loc.line} views memory at an address read "
                      f"in the kernel, which no tensor descriptor made at launch can reach (TMA)")
    body, tile_loop = kernel.body.stmts, None
    tiles = [s for s in body if isinstance(s, ir.For) and s.kind is ir.ForKind.PERSISTENT]
    if len(tiles) == 1 and loops and loops[0] in tiles[0].body.stmts:
        tile_loop = tiles[0]
        outside = [s for s in body if s is not tile_loop and not isinstance(s, ir.Alloc)]
        if outside:
            return None, (f"line {outside[0].loc.line} runs outside the T.Persistent tile loop")
        body = tile_loop.body.stmts
    if len(loops) != 1 or loops[0] not in body:
        return None, ("only a single pipelined loop at the top level of the kernel (or of its "
                      "T.Persistent tile loop) is supported")
    loop = loops[0]
    if kernel.threads % 128:
        return None, f"threads={kernel.threads} is not a whole number of warp groups"
    stmts, guarded = loop.body.stmts, False
    if len(stmts) == 1 and isinstance(stmts[0], ir.If) and not stmts[0].orelse.stmts:
        on_chip = [x for x in subexprs(stmts[0].cond) if isinstance(x, ir.Load)
                   and x.buffer.scope is not ir.Scope.GLOBAL]
        if on_chip:
            return None, (f"the condition at line {stmts[0].loc.line} reads on-chip memory, which "
                          f"the producer role does not have")
        stmts, guarded = stmts[0].then.stmts, True
    producers = [s for s in stmts if _is_producer(s)]
    if not producers:
        return None, "the loop holds no global -> shared copies of whole shared buffers"
    ring = {p.dst.buffer for p in producers}
    if len(ring) != len(producers):
        return None, "two copies in the loop fill the same shared buffer"
    position = {id(p): stmts.index(p) for p in producers}
    for k, s in enumerate(stmts):
        later = [p for p in producers if position[id(p)] > k and p.dst.buffer in touched(s)]
        if later:
            return None, (f"line {s.loc.line} uses '{later[0].dst.buffer.name}' before the copy "
                          f"that fills it in the same iteration (line {later[0].loc.line})")
    for s in walk(kernel.body):
        if s in producers:
            continue
        if isinstance(s, (ir.BarrierArrive, ir.BarrierWait)) or getattr(s, "barrier", None) is not None:
            return None, f"the kernel synchronizes explicitly (line {s.loc.line})"
        if ring & set(buffers_written(s)):
            return None, f"line {s.loc.line} writes a buffer the producers fill"
    loop_pos = body.index(loop)
    for s in body[:loop_pos] + body[loop_pos + 1:]:
        if tile_loop is not None and isinstance(s, ir.Alloc):
            return None, f"allocation inside the T.Persistent loop (line {s.loc.line})"
        if not isinstance(s, ir.Alloc) and ring & touched(s):
            return None, f"line {s.loc.line} uses a pipelined buffer outside the loop"
    if not any(ring & set(buffers_read(s)) for s in stmts if id(s) not in position):
        return None, "nothing in the loop reads what the copies load"
    stages = max(1, loop.num_stages)
    return PipelinePlan(loop_pos, tuple(position[id(p)] for p in producers), stages,
                        tuple(p.dst.buffer.name for p in producers), guarded,
                        None if tile_loop is None else kernel.body.stmts.index(tile_loop),
                        _preloads(kernel, body[:loop_pos])), ""


def _preloads(kernel: ir.Kernel, prelude) -> tuple[int, ...]:
    """Positions of the prelude's copies that the producer can issue (see the module docstring)."""
    out = []
    for k, s in enumerate(prelude):
        if not _is_producer(s):
            continue
        dst = s.dst.buffer
        writers = [t for t in walk(kernel.body) if t is not s and dst in buffers_written(t)]
        if not writers and not any(dst in touched(t) for t in prelude[:k]):
            out.append(k)
    return tuple(out)


def _is_producer(s: ir.Stmt) -> bool:
    if not (isinstance(s, ir.Copy) and s.barrier is None and s.src.buffer.scope is ir.Scope.GLOBAL
            and s.dst.buffer.scope is ir.Scope.SHARED):
        return False
    on_chip = any(isinstance(x, ir.Load) and x.buffer.scope is not ir.Scope.GLOBAL
                  for e in s.src.starts for x in subexprs(e))
    return s.dst.is_whole and not on_chip
