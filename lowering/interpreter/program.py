"""Runs a whole kernel: binds its arguments, walks the grid, runs each block's roles.

Contract: ``execute(kernel, args, ...)`` has ``run``'s meaning and returns the schedule trace
(the name of every scheduling choice, in order: a role, or the landing of an asynchronous copy),
so tests and tools can see which interleaving a seed produced.
* A kernel holding per-thread code (``Parallel(per_thread=True)``) is checked, when checking, for
  races between its threads too (``thread_races``), each block with a fresh tracker — unless it
  is warp-specialized: there a per-thread loop runs over its role's threads, not the block's,
  and what orders them within the role is the backend compiler's (Triton's barrier insertion
  puts a barrier of the partition's warps at every shared-memory hazard between its threads;
  the IR holds no ``BlockSync`` there), while the roles' accesses to each other's shared
  memory are checked by ``races`` against the mbarrier protocol as in any role.
* A kernel whose body holds ``Role`` blocks is first split (``roles.streams``) into block-wide
  allocations plus one ``WarpSpecialize``; each role then runs with ``128 * len(warpgroups)``
  threads. A kernel without roles is one role of ``kernel.threads`` threads.
* Blocks run one after another (``kernel.block_vars[0]`` fastest), each with fresh on-chip memory,
  barriers, clocks and its own scheduler, all drawing from one ``random.Random(seed)``. With
  ``block_order`` (a seed) they run in a shuffled order instead, as a GPU may start and finish
  them: a program that counts on the grid's order (the last block to arrive being the last in the
  grid) shows it.
"""
from __future__ import annotations

import itertools
import random
from typing import Optional

import numpy as np

from .. import ir
from ..plans import SharedMemoryPlan
from ..roles import streams
from ..traverse import per_thread_code, walk
from .addresses import AddressSpace
from .barriers import Barriers
from .binding import bind
from .executor import Block, RoleExecutor
from .expressions import Evaluator
from .memory import Memory, SharedArena
from .races import RaceTracker
from .scheduler import Scheduler
from .thread_races import ThreadRaces
from .values import Numerics


def execute(kernel: ir.Kernel, args: list, *, seed: int = 0, accumulate_f64: bool = False,
            check: bool = True, block_order: Optional[int] = None) -> list[str]:
    numerics = Numerics(accumulate_f64)
    arrays, env, finish = bind(kernel, args, numerics)
    allocs, roles = streams(kernel)
    grid = [Evaluator(None, numerics).index(g, env) for g in kernel.grid]
    rng = random.Random(seed)
    addresses = AddressSpace()
    trace: list[str] = []
    per_thread = check and per_thread_code(kernel.body) and not any(
        isinstance(s, (ir.Role, ir.WarpSpecialize)) for s in walk(kernel.body))
    suspects: dict[int, set[str]] = {}     # the racing candidates of each Parallel (executor)
    blocks = [c[::-1] for c in itertools.product(*(range(n) for n in reversed(grid)))]
    if block_order is not None:
        random.Random(block_order).shuffle(blocks)
    try:
        with np.errstate(all="ignore"):
            for coords in blocks:
                block_env = dict(env)
                block_env.update((v, np.int64(c)) for v, c in zip(kernel.block_vars, coords))
                for v, e in kernel.block_defs:
                    block_env[v] = np.int64(Evaluator(None, numerics).index(e, block_env))
                races = RaceTracker() if check else None
                threads = ThreadRaces(kernel.threads) if per_thread else None
                shared = kernel.find_plan(SharedMemoryPlan)
                memory = Memory(arrays, numerics, check, races,
                                SharedArena(shared) if shared is not None else None, threads)
                block = Block(memory, Barriers(), Evaluator(memory, numerics),
                              Scheduler(rng, trace, f"block {coords}"), races, addresses, threads,
                              suspects)
                _run_block(block, allocs, roles, block_env)
    finally:
        finish()
    return trace


def _run_block(block: Block, allocs: tuple[ir.Alloc, ...], roles, env: dict) -> None:
    for a in allocs:
        if a.buffer.scope is ir.Scope.BARRIER:
            block.barriers.allocate(a.buffer)
        else:
            block.memory.allocate(a.buffer)
    executors = [(name, RoleExecutor(block, name, threads).run(body, env))
                 for name, threads, body in roles]
    block.scheduler.run(executors)
