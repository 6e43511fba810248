"""plan_buffers: give every shared buffer and barrier a byte range by lifetime; check the shared budget.

Requires:  warp_specialize has run (rings and roles are final). On targets without warp
           specialization the backend places shared memory itself (Triton); the plan is then the
           bytes the program's tiles need before the backend's own multi-buffering, and the budget
           check a lower bound.
Ensures:   a ``SharedMemoryPlan``: ranges ((name, offset, bytes), ...) placed first-fit, largest
           buffer first, each at the lowest offset clear of every placed buffer whose live range
           (``lowering.liveness``) overlaps its own; so buffers whose lifetimes never overlap may
           share bytes, recorded as ``reuses`` (buffer, buffer whose bytes it reuses). Buffers of
           concurrently running roles never share (unless one role hands a buffer over to
           another through a barrier); barriers and buffers nothing accesses never share. Where the
           target's ``shared_reuse`` is off (Metal), nothing shares. Tiles are aligned to the
           largest power of two up to 1024 that their size reaches (at least 128: swizzled tiles
           need their swizzle's period), barriers to 8 bytes. ``total_bytes`` is the peak (the
           end of the highest range); above ``config.caps.smem_bytes`` it is a ``ResourceLimitError``
           (a ``CompileError`` a compile chain takes for this backend's refusal) at the kernel naming the largest buffers and what to shrink.
Preserves: the program.
"""
from __future__ import annotations

from typing import Optional

from .. import ir
from ..config import BackendConfig
from ..errors import ResourceLimitError
from ..liveness import LiveRange, live_ranges
from ..plans import SharedMemoryPlan
from ..traverse import walk


def run(kernel: ir.Kernel, config: BackendConfig) -> ir.Kernel:
    plan = place(kernel, config.caps.shared_reuse)
    top = plan.total_bytes
    if top > config.caps.smem_bytes:
        biggest = sorted(plan.ranges, key=lambda o: -o[2])[:3]
        raise ResourceLimitError(
            f"kernel '{kernel.name}' needs {top} bytes of shared memory, more than the "
            f"{config.caps.smem_bytes} target '{config.name}' has",
            kernel.loc,
            [f"largest: {', '.join(f'{n} ({b} bytes)' for n, _, b in biggest)}",
             "shrink block_M/block_N/block_K or num_stages (each stage holds one tile of every "
             "pipelined buffer)"])
    return kernel.with_plan(plan)


def place(kernel: ir.Kernel, reuse: bool = True) -> SharedMemoryPlan:
    """The kernel's shared buffers and barriers placed by lifetime (see the contract)."""
    lives = live_ranges(kernel) if reuse else {}
    wanted = []   # (bytes, alignment, allocation order, name, live range or None: never shares)
    for s in walk(kernel.body):
        if isinstance(s, ir.Alloc) and s.buffer.scope in (ir.Scope.SHARED, ir.Scope.BARRIER):
            b = s.buffer
            if b.scope is ir.Scope.BARRIER:
                wanted.append((8 * len(b.arrive_counts), 8, len(wanted), b.name, None))
            else:
                wanted.append((b.nbytes, _alignment(b.nbytes), len(wanted), b.name,
                               lives.get(b.name)))
    placed: list[tuple[str, int, int, Optional[LiveRange]]] = []
    for nbytes, align, _, name, life in sorted(wanted, key=lambda w: (-w[0], w[2])):
        busy = sorted((o, o + n) for _, o, n, other in placed if _conflict(life, other))
        offset = 0
        for lo, hi in busy:
            if offset + nbytes <= lo:
                break
            offset = max(offset, -(-hi // align) * align)
        placed.append((name, offset, nbytes, life))
    order = {w[3]: w[2] for w in wanted}
    placed.sort(key=lambda p: order[p[0]])
    reuses = tuple((_later(a, b), _earlier(a, b)) for i, a in enumerate(placed)
                   for b in placed[i + 1:] if a[1] < b[1] + b[2] and b[1] < a[1] + a[2])
    return SharedMemoryPlan(tuple((n, o, b) for n, o, b, _ in placed),
                            max((o + b for _, o, b, _ in placed), default=0), reuses)


def peak_after(pass_name: str, candidate: ir.Kernel, config: BackendConfig) -> int:
    """The peak of ``place``'s placement of ``candidate``, a form pass ``pass_name`` considers,
    after the passes of ``config``'s pipeline between that pass and this one (warp
    specialization, consumer splits, registerized buffers): the shared memory it would really
    take, for passes choosing between forms."""
    names = config.pipeline.pass_names
    for p in config.pipeline.passes[names.index(pass_name) + 1:names.index("plan_buffers")]:
        candidate = p.run(candidate, config)
    return place(candidate, config.caps.shared_reuse).total_bytes


def _alignment(nbytes: int) -> int:
    align = 128
    while align < 1024 and align * 2 <= nbytes:
        align *= 2
    return align


def _conflict(a: Optional[LiveRange], b: Optional[LiveRange]) -> bool:
    return a is None or b is None or a.overlaps(b)


def _starts(p) -> tuple:
    life: LiveRange = p[3]
    return (life.start, life.role_start)


def _later(a, b) -> str:
    return a[0] if _starts(a) > _starts(b) else b[0]


def _earlier(a, b) -> str:
    return b[0] if _starts(a) > _starts(b) else a[0]
