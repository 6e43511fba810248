"""plan_buffers: give every shared buffer and barrier a byte range; check the shared budget.

Requires:  warp_specialize has run (rings and roles are final). On targets without warp
           specialization the backend places shared memory itself (Triton); the plan is then the
           bytes the program's tiles need before the backend's own multi-buffering, and the budget
           check a lower bound.
Ensures:   a ``SharedMemoryPlan``: ranges ((name, offset, bytes), ...) with every range disjoint from
           every other (buffers of concurrently running roles never share bytes; no reuse is
           attempted), 128-byte aligned for tiles and 8-byte for barriers, and their total bytes;
           a total above ``config.caps.smem_bytes`` is a ``CompileError`` at the kernel naming the
           largest buffers and what to shrink.
Preserves: the program.
"""
from __future__ import annotations

from .. import ir
from ..plans import SharedMemoryPlan
from ..errors import CompileError
from ..config import BackendConfig


def run(kernel: ir.Kernel, config: BackendConfig) -> ir.Kernel:
    plan = SharedMemoryPlan.of(kernel.body)
    top = plan.total_bytes
    if top > config.caps.smem_bytes:
        biggest = sorted(plan.ranges, key=lambda o: -o[2])[:3]
        raise CompileError(
            f"kernel '{kernel.name}' needs {top} bytes of shared memory, more than the "
            f"{config.caps.smem_bytes} target '{config.name}' has",
            kernel.loc,
            [f"largest: {', '.join(f'{n} ({b} bytes)' for n, _, b in biggest)}",
             "shrink block_M/block_N/block_K or num_stages (each stage holds one tile of every "
             "pipelined buffer)"])
    return kernel.with_plan(plan)
