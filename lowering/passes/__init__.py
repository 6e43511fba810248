"""The pass pipeline. ``PIPELINE`` is the only place the order is written.

Each pass is a module with ``run(kernel, target) -> kernel``: pure, location-preserving, its
contract in its module docstring. ``lower`` runs ``verify`` after the frontend and after every
pass, and calls ``observe(name, kernel)`` after each (dumps, tests, timing).
"""
from __future__ import annotations

from pathlib import Path
from typing import Callable, Optional

from .. import ir, printer, verify
from ..target import Target
from . import (check_barriers, despecialize, double_buffer, infer_layouts, insert_syncs, legalize,
               legalize_metal,
               legalize_wgmma, overlap_mma, overlap_softmax, overlap_store, persist, pingpong, plan_buffers,
               plan_pipeline, split_consumers, swizzle_grid, warp_specialize)

PIPELINE: tuple[tuple[str, Callable[[ir.Kernel, Target], ir.Kernel]], ...] = (
    # Roles first: on targets without warp specialization the program becomes one stream, so
    # every later pass sees the program the backend will run.
    ("despecialize", despecialize.run),
    # The roles as written, before passes rewrite them: a deadlock is refused at the user's lines.
    ("check_barriers", check_barriers.run),
    # Before layouts and buffers: warp specialization decides which buffers become rings and
    # which roles exist, so later passes plan for the buffers and roles that really exist.
    # A large GEMM becomes persistent first, so the pipeline is planned inside its tile loop.
    ("persist", persist.run),
    ("plan_pipeline", plan_pipeline.run),
    ("warp_specialize", warp_specialize.run),
    # Roles are what they will be: one per consumer warp group where their rows are independent.
    ("split_consumers", split_consumers.run),
    # Rings and roles are final: place shared buffers and check the budget.
    ("plan_buffers", plan_buffers.run),
    ("infer_layouts", infer_layouts.run),
    # Last: records the target's choices (copy mechanism, matrix instruction) for the emitter.
    ("legalize", legalize.run),
    # Hopper's choices (TMA, wgmma, register budgets) or the reason to use triton.language.
    ("legalize_wgmma", legalize_wgmma.run),
    # After the instruction choice: the next block's first gemm under this block's fragment
    # math (attention's Q K^T under the softmax) ...
    ("overlap_softmax", overlap_softmax.run),
    # ... the split consumer warp groups taking turns to issue those gemms ...
    ("pingpong", pingpong.run),
    # ... and one wgmma in flight across iterations of a GEMM main loop.
    ("overlap_mma", overlap_mma.run),
    # ... and a tile's result store with the next tile's main loop (persistent kernels).
    ("overlap_store", overlap_store.run),
    # Last: persist made its own panels, and legalize read block ranges from the 2-d grid.
    ("swizzle_grid", swizzle_grid.run),
    # Metal's choices, on the final program: where each fragment lives (registers, simdgroup
    # matrices, shared memory) ...
    ("legalize_metal", legalize_metal.run),
    # ... a pipelined loop's next tiles loaded into second shared buffers, within the budget ...
    ("double_buffer", double_buffer.run),
    # ... and the block barriers between statements that share memory across threads.
    ("insert_syncs", insert_syncs.run),
)

Observer = Callable[[str, ir.Kernel], None]


def lower(kernel: ir.Kernel, target: Target, observe: Optional[Observer] = None,
          upto: Optional[str] = None, dump_dir: Optional[Path] = None) -> ir.Kernel:
    """Run the pipeline (up to and including pass ``upto``, if given); ``dump_dir`` (the
    ``TILEWS_DUMP_IR`` setting) receives the IR after each pass."""
    observers = [o for o in (observe, _dump_observer(dump_dir)) if o is not None]
    verify.run(kernel)
    for o in observers:
        o("frontend", kernel)
    for name, run in PIPELINE:
        kernel = run(kernel, target)
        verify.run(kernel)
        for o in observers:
            o(name, kernel)
        if name == upto:
            break
    return kernel


def _dump_observer(root: Optional[Path]) -> Optional[Observer]:
    """Writes the IR after each pass to ``root`` as ``<kernel>.<n>.<pass>.tir``."""
    if root is None:
        return None
    counter = iter(range(1 << 30))

    def dump(name: str, kernel: ir.Kernel) -> None:
        path = Path(root)
        path.mkdir(parents=True, exist_ok=True)
        (path / f"{kernel.name}.{next(counter):02d}.{name}.tir").write_text(printer.to_text(kernel))
    return dump
