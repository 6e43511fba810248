"""Tensors reached through pointer tables: ``T.Tensor([n], T.ptr)`` and ``T.make_tensor``.

A grouped GEMM whose groups live in separate tensors, passed as tables of ``data_ptr()``s, runs on
the interpreter and on Triton's CPU interpreter against float64 references; a copy through a view
with ragged boundary tiles checks the masks; Hopper compiles the GEMM with triton.language and no
TMA; Metal refuses; bad ``T.make_tensor`` arguments are errors at the user's line.
"""
from __future__ import annotations

import math

import pytest
import torch

import tilews
import tilews.language as T
from tilews.lowering import printer
from tilews.errors import InvalidAddressError

from .helpers import marked_line, poisoned, randn

NO_WS = {"tl.disable_tma_lower": True, "tl.disable_warp_specialized": True}


def table(tensors) -> torch.Tensor:
    return torch.tensor([t.data_ptr() for t in tensors], dtype=torch.int64)


def group_of(bx, first_tiles, groups: int):
    """(group, its first tile) of output row tile ``bx``: the last group whose first tile is at or
    before it (a select chain built at build time)."""
    group, first = 0, 0
    for i in range(1, groups):
        here = bx >= first_tiles[i]
        group = T.if_then_else(here, i, group)
        first = T.if_then_else(here, first_tiles[i], first)
    return group, first


def grouped_gemm(rows, K, N, block_M, block_N, block_K, dtype=T.float16):
    """C_g = A_g @ B_g for each group g; A_g and C_g hold max(rows) rows, of which rows[g] count."""
    groups, max_M = len(rows), max(rows)
    tiles = [math.ceil(r / block_M) for r in rows]

    @T.prim_func
    def main(A_ptrs: T.Tensor([groups], T.ptr), B_ptrs: T.Tensor([groups], T.ptr),
             C_ptrs: T.Tensor([groups], T.ptr), first_tiles: T.Tensor([groups], T.int32)):
        with T.Kernel(sum(tiles), T.ceildiv(N, block_N), threads=128) as (bx, by):
            A_s = T.alloc_shared((block_M, block_K), dtype)
            B_s = T.alloc_shared((block_K, block_N), dtype)
            acc = T.alloc_fragment((block_M, block_N), T.float32)
            g, first = group_of(bx, first_tiles, groups)
            row = (bx - first) * block_M
            A = T.make_tensor(A_ptrs[g], (max_M, K), dtype)
            B = T.make_tensor(B_ptrs[g], (K, N), dtype)
            C = T.make_tensor(C_ptrs[g], (max_M, N), dtype)
            T.clear(acc)
            for ko in T.Pipelined(T.ceildiv(K, block_K), num_stages=1):
                T.copy(A[row, ko * block_K], A_s)
                T.copy(B[ko * block_K, by * block_N], B_s)
                T.gemm(A_s, B_s, acc)
            T.copy(acc, C[row, by * block_N])

    first = [sum(tiles[:g]) for g in range(groups)]
    return main, first, tiles


ROWS, K, N, BLOCK = [5, 20, 37], 64, 48, 16


def build_gemm(target, pass_configs=NO_WS):
    program, first, tiles = grouped_gemm(ROWS, K, N, BLOCK, BLOCK, 32)
    return tilews.jit(target=target, pass_configs=pass_configs)(lambda: program)(), first, tiles


@pytest.mark.parametrize("target", ["interpret", "triton"])
def test_grouped_gemm_by_pointer_tables(target):
    kernel, first, tiles = build_gemm(target)
    max_M = max(ROWS)
    a = [randn(max_M, K, dtype=torch.float16, seed=g) for g in range(len(ROWS))]
    b = [randn(K, N, dtype=torch.float16, seed=10 + g) for g in range(len(ROWS))]
    c = [poisoned(max_M, N, dtype=torch.float16) for _ in ROWS]
    kernel(table(a), table(b), table(c), torch.tensor(first, dtype=torch.int32))
    for g, rows in enumerate(ROWS):
        ref = a[g][:rows].double() @ b[g].double()
        # fp16 inputs, fp32 accumulation, fp16 output: the output's rounding dominates
        torch.testing.assert_close(c[g][:rows].double(), ref, atol=2e-2, rtol=1e-2)
        untouched = c[g][tiles[g] * BLOCK:]        # rows past the group's tiles: never written
        assert torch.isnan(untouched).all(), f"group {g}: rows past its tiles were written"


def view_copy(M, N, block):
    """out = the [M, N] tensor at src_ptrs[0], copied in block x block tiles (ragged edges)."""
    @T.prim_func
    def main(src_ptrs: T.Tensor([1], T.ptr), out: T.Tensor((M, N), T.float32)):
        with T.Kernel(T.ceildiv(M, block), T.ceildiv(N, block), threads=32) as (bx, by):
            tile = T.alloc_shared((block, block), T.float32)
            src = T.make_tensor(src_ptrs[0], (M, N), T.float32)
            T.copy(src[bx * block, by * block], tile)
            T.copy(tile, out[bx * block, by * block])
    return main


@pytest.mark.parametrize("target", ["interpret", "triton"])
def test_copy_through_a_view_masks_boundary_tiles(target):
    M, N = 37, 21
    kernel = tilews.jit(out_idx=[-1], target=target)(view_copy)(M, N, 16)
    # the view's memory sits inside a larger tensor, with guard elements after it
    storage = randn(M * N + 64, seed=3)
    out = kernel(table([storage]))
    assert torch.equal(out, storage[:M * N].view(M, N))
    assert "[masked]" in printer.to_text(kernel.ir_after)


def test_interpreter_refuses_a_null_address():
    kernel = tilews.jit(out_idx=[-1], target="interpret")(view_copy)(16, 16, 16)
    with pytest.raises(InvalidAddressError, match="address 0"):
        kernel(torch.zeros(1, dtype=torch.int64))


@pytest.mark.parametrize("pass_configs", [NO_WS, {}], ids=["tma_off", "default"])
def test_hopper_compiles_views_without_tma(pass_configs):
    kernel, _, _ = build_gemm("hopper", pass_configs)
    assert kernel.report.target == "hopper -> triton", kernel.report.notes
    source = kernel.get_kernel_source()
    assert source.count("tl.pointer_type(tl.float16)") == 3
    assert "tma" not in source.lower() and "descriptor" not in source.lower()
    if not pass_configs:
        assert any("T.make_tensor at line" in n and "TMA" in n for n in kernel.report.notes), \
            kernel.report.notes


def test_metal_refuses_make_tensor():
    def program(M):
        @T.prim_func
        def main(src_ptrs: T.Tensor([1], T.ptr), out: T.Tensor((M,), T.float32)):
            with T.Kernel(1, threads=32) as bx:
                src = T.make_tensor(src_ptrs[0], (M,), T.float32)  # <- error
                T.copy(src[0:M], out[0:M])
        return main

    with pytest.raises(tilews.CompileError, match="not supported on Metal") as e:
        tilews.jit(out_idx=[-1], target="metal")(program)(32)
    assert e.value.loc.line == marked_line(program)


def _make_tensor_error(address, shape, dtype):
    def program():
        @T.prim_func
        def main(P: T.Tensor([1], T.ptr), I: T.Tensor([1], T.int32), out: T.Tensor((8,), T.float32)):
            with T.Kernel(1, threads=32) as bx:
                X = T.make_tensor(address(P, I), shape, dtype)  # <- error
                T.copy(X[0:8], out[0:8])
        return main
    with pytest.raises(tilews.CompileError) as e:
        tilews.jit(out_idx=[-1], target="interpret")(program)()
    assert e.value.loc.line == marked_line(program)
    return str(e.value)


@pytest.mark.parametrize("address, shape, dtype, fragment", [
    (lambda P, I: I[0], (8,), T.float32, "address has dtype int32, not a pointer"),
    (lambda P, I: 4096, (8,), T.float32, "address must be a device address"),
    (lambda P, I: P, (8,), T.float32, "address is the whole tensor 'P'"),
    (lambda P, I: P[0], (8, 0), T.float32, "shape[1] is 0"),
    (lambda P, I: P[0], "8", T.float32, "shape must be a non-empty tuple"),
    (lambda P, I: P[0], (8,), None, "dtype is missing"),
], ids=["int32_value", "python_int", "whole_table", "zero_dim", "not_a_tuple", "no_dtype"])
def test_make_tensor_argument_errors(address, shape, dtype, fragment):
    assert fragment in _make_tensor_error(address, shape, dtype)


def test_a_view_used_outside_its_block_is_an_error():
    def program():
        @T.prim_func
        def main(P: T.Tensor([2], T.ptr), out: T.Tensor((8,), T.float32)):
            with T.Kernel(1, threads=32) as bx:
                for i in T.serial(2):
                    X = T.make_tensor(P[i], (8,), T.float32)
                T.copy(X[0:8], out[0:8])  # <- error
        return main
    with pytest.raises(tilews.CompileError, match="'X' was assigned inside a runtime loop") as e:
        tilews.jit(out_idx=[-1], target="interpret")(program)()
    assert e.value.loc.line == marked_line(program)
