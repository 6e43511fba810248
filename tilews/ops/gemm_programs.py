"""The GEMM programs ``tilews.ops.matmul`` chooses among, written in the tile language.

Each is a ``tilews.jit`` factory over the problem shape and a schedule's knobs; ``matmul_schedule``
says which program and knobs a shape gets. All compute ``C = A @ B`` for A [M, K] and B [K, N]
(row-major) with float32 accumulation:

* ``tiled``: one block per output tile (the warp-specialized TMA ring on Hopper); 64-row tiles
  for small M, narrow tiles for small N.
* ``persistent``: one block per SM over the output tiles in grouped order; on Hopper the next
  tile's loads run under this tile's store.
* ``split_k`` + ``split_k_reduce``: the K loop cut into ``splits`` slices, each block writing a
  float32 partial tile into a workspace [M, splits * N'] (N' = N in whole tiles); a second kernel sums the slices in a fixed
  order (deterministic) and casts. For shapes with too few output tiles to fill the GPU.
* ``split_k_fused``: split-K in one kernel: each block stores its float32 partial tile as
  ``split_k`` does, then counts itself in a per-tile arrival counter; the block arriving last
  sums the slices (in slice order: deterministic) and stores C. Saves the reduction kernel's
  launch and ramp, which is most of the time at M <= 32. With 16- or 32-row blocks it is a
  ``triton.language`` kernel (cp.async ring, mma); with 64-row multiples it is warp-specialized
  on Hopper, its tiles stored from registers ahead of the release (``warp_specialize``).
* ``swap_ab``: C^T = B^T A^T for small M, so N fills the wgmma's 64-row M dimension and M becomes
  the narrow N of the instruction; the tile is stored transposed.
"""
from __future__ import annotations

import tilews
import tilews.language as T


@tilews.jit(out_idx=[-1])
def tiled(M, N, K, block_M=128, block_N=128, block_K=64, num_stages=3, threads=128, swizzle=0,
          dtype=T.bfloat16, out_dtype=T.bfloat16):
    @T.prim_func
    def main(A: T.Tensor((M, K), dtype), B: T.Tensor((K, N), dtype), C: T.Tensor((M, N), out_dtype)):
        with T.Kernel(T.ceildiv(N, block_N), T.ceildiv(M, block_M), threads=threads) as (bx, by):
            if swizzle:
                T.use_swizzle(swizzle)
            A_s = T.alloc_shared((block_M, block_K), dtype)
            B_s = T.alloc_shared((block_K, block_N), dtype)
            C_f = T.alloc_fragment((block_M, block_N), T.float32)
            T.clear(C_f)
            for k in T.Pipelined(T.ceildiv(K, block_K), num_stages=num_stages):
                T.copy(A[by * block_M, k * block_K], A_s)
                T.copy(B[k * block_K, bx * block_N], B_s)
                T.gemm(A_s, B_s, C_f)
            T.copy(C_f, C[by * block_M, bx * block_N])
    return main


@tilews.jit(out_idx=[-1])
def persistent(M, N, K, block_M=128, block_N=256, block_K=64, num_stages=3, threads=256,
               num_sms=132, group_size=8, dtype=T.bfloat16, out_dtype=T.bfloat16):
    @T.prim_func
    def main(A: T.Tensor((M, K), dtype), B: T.Tensor((K, N), dtype), C: T.Tensor((M, N), out_dtype)):
        with T.Kernel(num_sms, threads=threads) as block_id:
            A_s = T.alloc_shared((block_M, block_K), dtype)
            B_s = T.alloc_shared((block_K, block_N), dtype)
            C_f = T.alloc_fragment((block_M, block_N), T.float32)
            for bx, by in T.Persistent([T.ceildiv(M, block_M), T.ceildiv(N, block_N)], num_sms,
                                       block_id, group_size):
                T.clear(C_f)
                for k in T.Pipelined(T.ceildiv(K, block_K), num_stages=num_stages):
                    T.copy(A[bx * block_M, k * block_K], A_s)
                    T.copy(B[k * block_K, by * block_N], B_s)
                    T.gemm(A_s, B_s, C_f)
                T.copy(C_f, C[bx * block_M, by * block_N])
    return main


def k_tiles_per_split(K: int, block_K: int, splits: int) -> int:
    """How many block_K-wide k tiles each of ``splits`` slices covers (the last may cover fewer
    real ones: its loads past K read zeros)."""
    return -(-(-(-K // block_K)) // splits)


def split_width(N: int, block_N: int) -> int:
    """Columns of one slice in the split-K workspace: N rounded up to whole tiles, so a ragged
    last tile's bulk store stays inside its own slice."""
    return -(-N // block_N) * block_N


@tilews.jit(out_idx=[-1])
def split_k(M, N, K, splits=4, block_M=64, block_N=128, block_K=64, num_stages=4, threads=128,
            dtype=T.bfloat16):
    """Partial products in float32: W[:, s * Np : s * Np + N] = A[:, Ks] @ B[Ks, :] for the s-th
    slice Ks of K (Np = ``split_width(N, block_N)``; columns N..Np of each slice are zeros)."""
    per = k_tiles_per_split(K, block_K, splits)
    Np = split_width(N, block_N)

    @T.prim_func
    def main(A: T.Tensor((M, K), dtype), B: T.Tensor((K, N), dtype),
             W: T.Tensor((M, splits * Np), T.float32)):
        with T.Kernel(T.ceildiv(N, block_N), T.ceildiv(M, block_M), splits, threads=threads) as (bx, by, bz):
            C_f = T.alloc_fragment((block_M, block_N), T.float32)
            _k_slice(A, B, C_f, bx, by, bz, per, block_K, num_stages)
            T.copy(C_f, W[by * block_M, bz * Np + bx * block_N])
    return main


@T.macro
def _k_slice(A, B, C_f, bx, by, bz, per, block_K, num_stages):
    """C_f = the product of A's row tile ``by`` and B's column tile ``bx`` (C_f's shape) over
    the ``per`` k tiles of K slice ``bz``, through a ``num_stages`` ring."""
    block_M, block_N = C_f.shape
    A_s = T.alloc_shared((block_M, block_K), A.dtype)
    B_s = T.alloc_shared((block_K, block_N), B.dtype)
    T.clear(C_f)
    for k in T.Pipelined(per, num_stages=num_stages):
        T.copy(A[by * block_M, (bz * per + k) * block_K], A_s)
        T.copy(B[(bz * per + k) * block_K, bx * block_N], B_s)
        T.gemm(A_s, B_s, C_f)


@tilews.jit(out_idx=[-1])
def split_k_reduce(M, N, splits, split_N, block_M=32, block_N=128, threads=128, out_dtype=T.bfloat16):
    """C = the sum over s of W's slice s (``split_N`` columns apart), in slice order, cast to
    ``out_dtype``."""
    @T.prim_func
    def main(W: T.Tensor((M, splits * split_N), T.float32), C: T.Tensor((M, N), out_dtype)):
        with T.Kernel(T.ceildiv(N, block_N), T.ceildiv(M, block_M), threads=threads) as (bx, by):
            acc = T.alloc_fragment((block_M, block_N), T.float32)
            T.clear(acc)
            for s in T.serial(splits):
                for i, j in T.Parallel(block_M, block_N):
                    acc[i, j] += W[by * block_M + i, s * split_N + bx * block_N + j]
            T.copy(acc, C[by * block_M, bx * block_N])
    return main


ARRIVAL_SLOTS = T.dynamic("arrival_slots")


@tilews.jit(out_idx=[-2, -1])
def split_k_fused(M, N, K, splits=2, block_M=16, block_N=64, block_K=128, num_stages=4, threads=128,
                  dtype=T.bfloat16, out_dtype=T.bfloat16):
    """C = A @ B, K cut into ``splits`` slices, one block per (output tile, slice), summed in the
    same kernel. Each block stores its float32 partial into W (``split_k``'s layout), then adds 1
    to ``Arrivals[tile]`` (acq_rel, tiles numbered row by row); the block that sees
    ``splits - 1`` there arrived last: every other partial is visible to it. It sums the partials
    in slice order (the same bits whichever block is last), stores C and puts the count back to 0.

    Contract: ``Arrivals`` holds zeros at launch, at least ``ceildiv(M, block_M) *
    ceildiv(N, block_N)`` of them, and no other launch uses it meanwhile (one per stream). W is
    scratch; it is returned only because outputs are how a kernel gets fresh memory."""
    per = k_tiles_per_split(K, block_K, splits)
    Np = split_width(N, block_N)
    n_tiles = -(-N // block_N)

    @T.prim_func
    def main(A: T.Tensor((M, K), dtype), B: T.Tensor((K, N), dtype),
             Arrivals: T.Tensor((ARRIVAL_SLOTS,), T.int32), W: T.Tensor((M, splits * Np), T.float32),
             C: T.Tensor((M, N), out_dtype)):
        with T.Kernel(n_tiles, T.ceildiv(M, block_M), splits, threads=threads) as (bx, by, bz):
            C_f = T.alloc_fragment((block_M, block_N), T.float32)
            _k_slice(A, B, C_f, bx, by, bz, per, block_K, num_stages)
            T.copy(C_f, W[by * block_M, bz * Np + bx * block_N])
            tile = by * n_tiles + bx
            arrived = T.atomic_add(Arrivals[tile], 1, memory_order="acq_rel", return_prev=True)
            if arrived == splits - 1:
                T.clear(C_f)
                for s in T.serial(splits):
                    for i, j in T.Parallel(block_M, block_N):
                        C_f[i, j] += W[by * block_M + i, s * Np + bx * block_N + j]
                T.copy(C_f, C[by * block_M, bx * block_N])
                T.atomic_add(Arrivals[tile], -splits)
    return main


@tilews.jit(out_idx=[-1])
def swap_ab(M, N, K, block_N=128, block_M=32, block_K=64, num_stages=6, threads=128,
            dtype=T.bfloat16, out_dtype=T.bfloat16):
    """C^T tiles: [block_N, block_M] = B[:, n-tile]^T @ A[m-tile, :]^T, stored transposed."""
    @T.prim_func
    def main(A: T.Tensor((M, K), dtype), B: T.Tensor((K, N), dtype), C: T.Tensor((M, N), out_dtype)):
        with T.Kernel(T.ceildiv(N, block_N), T.ceildiv(M, block_M), threads=threads) as (bx, by):
            A_s = T.alloc_shared((block_M, block_K), dtype)
            B_s = T.alloc_shared((block_K, block_N), dtype)
            Ct_f = T.alloc_fragment((block_N, block_M), T.float32)
            T.clear(Ct_f)
            for k in T.Pipelined(T.ceildiv(K, block_K), num_stages=num_stages):
                T.copy(A[by * block_M, k * block_K], A_s)
                T.copy(B[k * block_K, bx * block_N], B_s)
                T.gemm(B_s, A_s, Ct_f, transpose_A=True, transpose_B=True)
            for i, j in T.Parallel(block_N, block_M):
                C[by * block_M + j, bx * block_N + i] = Ct_f[i, j]
    return main
