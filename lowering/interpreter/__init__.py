"""The reference interpreter: it defines what a Tile IR program means.

``run(kernel, args)`` executes ``kernel`` on the CPU with numpy, one block (program instance) at a
time, reading and writing the caller's torch tensors in place. Roles of a warp-specialized block
run as coroutines under a seeded random scheduler; barriers have mbarrier semantics (phase,
arrival count, transaction bytes) and asynchronous copies land at a scheduler-chosen later point.
It raises:

* ``RaceError`` for conflicting shared-memory accesses not ordered by barriers (between roles:
  vector clocks; between the threads of per-thread code: block barriers, ``thread_races``),
* ``DeadlockError`` when every unfinished role waits on a barrier and no copy is in flight,
* ``UninitializedReadError`` for reads of on-chip memory nothing wrote,

each naming the user's ``file:line``. ``check=False`` turns off race and initialization tracking
(not deadlock detection). ``accumulate_f64=True`` holds float fragments/locals and on-chip float
arithmetic in float64. Modules: ``values`` (dtypes, rounding), ``memory`` (buffers, written
masks), ``expressions`` (vectorized Expr evaluation), ``barriers`` (mbarriers, clocks), ``races``,
``thread_races``, ``scheduler``, ``executor`` (statements), ``binding`` (arguments), ``program``
(grid and roles), ``messages`` (how errors name things).
"""
from __future__ import annotations

from typing import Optional

from .. import arguments, ir
from .program import execute


def run(kernel: ir.Kernel, args: list, *, seed: int = 0, accumulate_f64: bool = False,
        check: bool = True, block_order: Optional[int] = None) -> None:
    """Execute ``kernel`` on ``args`` (aligned with ``kernel.params``: a torch tensor per buffer,
    a number per runtime scalar), after checking them (``lowering.arguments.check``). Results land
    in the argument tensors. ``block_order``: a seed shuffling the order blocks run in (else the
    grid's order; ``program``)."""
    arguments.check(kernel, args)
    execute(kernel, args, seed=seed, accumulate_f64=accumulate_f64, check=check,
            block_order=block_order)


__all__ = ["run"]
