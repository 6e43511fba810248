"""panel_grid: an explicit GEMM that leaves its block order open (``examples/ws_gemm.py``'s
programs without ``T.use_swizzle``) visits its tiles in panels of 16 rows, as the persistent GEMM
does; a program's own ``T.use_swizzle``, grids no larger than the machine and kernels that do not
read row and column panels keep their order."""
from __future__ import annotations

import re

import torch

import tilews.language as T
from examples.ws_gemm import ws_matmul_program, ws_ring_matmul_program
from tilews.lowering import ir
from tilews.lowering.frontend import build_kernel
from tilews.lowering.pipeline import lower
from tilews.lowering.simplify import evaluate
from tilews.triton_ext.gluon.backend import HOPPER

from ..helpers import gluon_program, randn
from ..test_ws_oracle import run_interp

H200 = HOPPER.replace(num_sms=132)


def panel_notes(kernel: ir.Kernel) -> list[str]:
    return [n for n in kernel.notes if n.startswith("panel_grid:")]


def test_seed_gemm_visits_its_tiles_in_panels():
    kernel = lower(build_kernel(ws_matmul_program(8192, 8192, 8192, dtype=T.bfloat16)), H200)
    [note] = panel_notes(kernel)
    assert "64 x 64 blocks read row panels of A and column panels of B" in note
    assert "panels of 16 rows" in note
    assert [evaluate(g) for g in kernel.grid] == [4096]
    assert [v.name for v, _ in kernel.block_defs] == ["by", "bx"]
    source = gluon_program(kernel).asm["gluon"]
    assert re.search(r"block_id // 1024\) \* 16", source), "panels of 16 rows of 64 tiles"


def test_the_programs_own_order_is_kept():
    kernel = lower(build_kernel(ws_ring_matmul_program(8192, 8192, 8192, swizzle=8)), H200)
    assert not panel_notes(kernel)
    assert [evaluate(g) for g in kernel.grid] == [2048]      # T.use_swizzle(8)'s linear grid
    unswizzled = lower(build_kernel(ws_ring_matmul_program(8192, 8192, 8192, swizzle=0)), H200)
    assert panel_notes(unswizzled)


def test_small_grids_and_unknown_machines_keep_launch_order():
    fits = lower(build_kernel(ws_matmul_program(1024, 1024, 1024)), H200)       # 64 blocks
    unknown = lower(build_kernel(ws_matmul_program(8192, 8192, 8192)), HOPPER)  # SM count unknown
    for kernel in (fits, unknown):
        assert not panel_notes(kernel) and len(kernel.grid) == 2


def test_kernels_without_row_and_column_panels_keep_launch_order():
    """Each block copies its own tile (no operand shared along a row or a column of blocks)."""
    @T.prim_func
    def scale(X: T.Tensor((4096, 4096), T.float16), Y: T.Tensor((4096, 4096), T.float16)):
        with T.Kernel(32, 32, threads=128) as (bx, by):
            t = T.alloc_shared((128, 128), T.float16)
            T.copy(X[by * 128, bx * 128], t)
            T.copy(t, Y[by * 128, bx * 128])
    kernel = lower(build_kernel(scale), H200)
    assert not panel_notes(kernel) and len(kernel.grid) == 2


def test_paneled_gemm_computes_the_product():
    """A 3 x 5 grid of 64 x 32 tiles on a machine of 4 SMs: every tile computed once, in the
    panel order, under several schedules."""
    M, N, K = 192, 160, 96
    a, b = randn(M, K, dtype=torch.float16, seed=3), randn(K, N, dtype=torch.float16, seed=4)
    args = [a, b, torch.empty(M, N, dtype=torch.float16)]
    kernel = lower(build_kernel(ws_matmul_program(M, N, K, block_M=64, block_N=32, block_K=32)),
                   HOPPER.replace(num_sms=4))
    assert panel_notes(kernel) and len(kernel.grid) == 1
    want = a.float() @ b.float()
    for seed in range(3):
        got = run_interp(kernel, args, 2, seed=seed).float()
        assert ((got - want).norm() / want.norm()).item() < 2e-3, seed
