"""The explicit warp-specialized GEMM of docs/design.md §2: a producer warp group fills shared memory,
ONE consumer role of two warp groups (``T.ws(1, 2)``) multiplies; they hand over through
barriers that count arriving threads. As written the roles take turns on one pair of tiles; on
Hopper ``ring_handshakes`` makes the pair a ring, so the producer loads ahead of the gemms.

``python examples/ws_gemm.py`` runs it in the reference interpreter under several schedules (where
races and deadlocks are detected) and on the best target here, checking against torch.
"""
from __future__ import annotations

import sys

import torch

import tilews
import tilews.language as T
from tilews.testing import best_device, rel_err


def ws_matmul_program(M, N, K, block_M=128, block_N=128, block_K=32, dtype=T.float16,
                      accum=T.float32):
    @T.prim_func
    def main(A: T.Tensor((M, K), dtype), B: T.Tensor((K, N), dtype), C: T.Tensor((M, N), dtype)):
        with T.Kernel(T.ceildiv(N, block_N), T.ceildiv(M, block_M), threads=384) as (bx, by):
            A_s = T.alloc_shared((block_M, block_K), dtype)
            B_s = T.alloc_shared((block_K, block_N), dtype)
            C_f = T.alloc_fragment((block_M, block_N), accum)
            ready = T.alloc_barrier(arrive_count=128)      # the producer warp group arrives
            done = T.alloc_barrier(arrive_count=256)       # both consumer warp groups arrive
            with T.ws(1, 2):
                T.clear(C_f)
            for ko in range(T.ceildiv(K, block_K)):
                with T.ws(0):
                    T.barrier_wait(done, (ko + 1) % 2)
                    T.copy(A[by * block_M, ko * block_K], A_s)
                    T.copy(B[ko * block_K, bx * block_N], B_s)
                    T.barrier_arrive(ready)
                with T.ws(1, 2):
                    T.barrier_wait(ready, ko % 2)
                    T.gemm(A_s, B_s, C_f)
                    T.barrier_arrive(done)
            with T.ws(1, 2):
                T.copy(C_f, C[by * block_M, bx * block_N])
    return main


def ws_ring_matmul_program(M, N, K, block_M=128, block_N=256, block_K=64, stages=3, swizzle=8,
                           dtype=T.bfloat16, accum=T.float32):
    """The same roles over a ``stages``-deep ring of shared buffers, each slot guarded by a
    full/empty barrier pair (docs/ws-semantics.md #7): the producer runs up to ``stages`` tiles ahead."""
    @T.prim_func
    def main(A: T.Tensor((M, K), dtype), B: T.Tensor((K, N), dtype), C: T.Tensor((M, N), dtype)):
        with T.Kernel(T.ceildiv(N, block_N), T.ceildiv(M, block_M), threads=384) as (bx, by):
            if swizzle:
                T.use_swizzle(swizzle)          # visit tiles in panels for L2 reuse
            A_s = T.alloc_shared((stages, block_M, block_K), dtype)
            B_s = T.alloc_shared((stages, block_K, block_N), dtype)
            C_f = T.alloc_fragment((block_M, block_N), accum)
            full = T.alloc_barrier([128] * stages)
            empty = T.alloc_barrier([256] * stages)
            with T.ws(1, 2):
                T.clear(C_f)
            for ko in range(T.ceildiv(K, block_K)):
                with T.ws(0):
                    T.barrier_wait(empty[ko % stages], ((ko // stages) & 1) ^ 1)
                    T.copy(A[by * block_M, ko * block_K], A_s[ko % stages, :, :])
                    T.copy(B[ko * block_K, bx * block_N], B_s[ko % stages, :, :])
                    T.barrier_arrive(full[ko % stages])
                with T.ws(1, 2):
                    T.barrier_wait(full[ko % stages], (ko // stages) & 1)
                    T.gemm(A_s[ko % stages, :, :], B_s[ko % stages, :, :], C_f)
                    T.barrier_arrive(empty[ko % stages])
            with T.ws(1, 2):
                T.copy(C_f, C[by * block_M, bx * block_N])
    return main


def pingpong_matmul_program(M, N, K, block_M=128, block_N=128, block_K=64, stages=4, num_sms=None,
                            group_size=8, dtype=T.bfloat16, accum=T.float32):
    """Persistent ping-pong: one producer warp group loads the (tile, k) sequence of this block's
    tiles; consumer T.ws(1) takes the even tiles and T.ws(2) the odd ones, each a whole tile in
    its own accumulator. A pair of `turn` barriers orders their main loops, so one consumer's
    epilogue (store of its tile) runs while the other's wgmmas run."""
    sms = num_sms or tilews.num_sms()
    tiles_m, tiles_n = T.ceildiv(M, block_M), T.ceildiv(N, block_N)
    k_tiles = T.ceildiv(K, block_K)

    def coords(tile):
        """Tile -> (row block, column block), in panels of group_size row blocks (L2 reuse)."""
        width = group_size * tiles_n
        first = tile // width * group_size
        rows = T.min(tiles_m - first, group_size)
        return first + tile % width % rows, tile % width // rows

    @T.prim_func
    def main(A: T.Tensor((M, K), dtype), B: T.Tensor((K, N), dtype), C: T.Tensor((M, N), dtype)):
        with T.Kernel(sms, threads=384) as block_id:
            A_s = T.alloc_shared((stages, block_M, block_K), dtype)
            B_s = T.alloc_shared((stages, block_K, block_N), dtype)
            C1 = T.alloc_fragment((block_M, block_N), accum)
            C2 = T.alloc_fragment((block_M, block_N), accum)
            full = T.alloc_barrier([128] * stages)
            empty = T.alloc_barrier([128] * stages)       # released by whichever consumer read it
            turn = T.alloc_barrier([128, 128])            # turn[c]: consumer c + 1 may run its MMAs
            my_tiles = T.ceildiv(tiles_m * tiles_n - block_id, sms)
            with T.ws(0):
                for j in T.serial(my_tiles):
                    bx, by = coords(block_id + j * sms)
                    for k in T.serial(k_tiles):
                        it = j * k_tiles + k
                        T.barrier_wait(empty[it % stages], ((it // stages) & 1) ^ 1)
                        T.copy(A[bx * block_M, k * block_K], A_s[it % stages, :, :])
                        T.copy(B[k * block_K, by * block_N], B_s[it % stages, :, :])
                        T.barrier_arrive(full[it % stages])
            for c, acc in [(0, C1), (1, C2)]:      # T.ws(1 + c) takes this block's tiles c, c + 2, ...
                with T.ws(1 + c):
                    for j in T.serial(c, my_tiles, 2):
                        bx, by = coords(block_id + j * sms)
                        # wait until the other consumer's previous main loop ended (T.ws(1)'s
                        # first wait is on a fresh barrier's parity 1 and passes at once)
                        T.barrier_wait(turn[c], (j // 2 + 1 - c) & 1)
                        T.clear(acc)
                        for k in T.serial(k_tiles):
                            it = j * k_tiles + k
                            T.barrier_wait(full[it % stages], (it // stages) & 1)
                            T.gemm(A_s[it % stages, :, :], B_s[it % stages, :, :], acc)
                            T.barrier_arrive(empty[it % stages])
                        T.barrier_arrive(turn[1 - c])     # the other consumer may run its MMAs
                        T.copy(acc, C[bx * block_M, by * block_N])
    return main


def ws_matmul(M, N, K, target="auto", **kw):
    return tilews.jit(out_idx=[-1], target=target)(ws_matmul_program)(M, N, K, **kw)


def main(argv=None) -> int:
    M, N, K = 160, 136, 100
    blocks = dict(block_M=64, block_N=64, block_K=32)
    a, b = torch.randn(M, K).half(), torch.randn(K, N).half()
    ref = a.double() @ b.double()
    ok = True
    for seed in range(3):
        k = tilews.jit(out_idx=[-1], target="interpret", seed=seed)(ws_matmul_program)(M, N, K, **blocks)
        err = rel_err(k(a, b), ref)
        print(f"ws_gemm {M}x{N}x{K} interpreter, schedule seed {seed}: rel err {err:.2e}")
        ok &= err < 1e-2
    device = best_device()
    k = ws_matmul(M, N, K, **blocks)
    err = rel_err(k(a.to(device), b.to(device)), ref)
    print(f"ws_gemm on target '{k.target}': rel err {err:.2e}")
    for note in k.report.notes:
        print(f"  note: {note}")
    ok &= err < 1e-2
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
