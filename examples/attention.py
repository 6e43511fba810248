"""Attention forward (FlashAttention's online softmax), two ways.

* ``mha_fwd`` (``tilews/ops/attention.py``, behind ``tilews.ops.attention``): TileLang's program
  (``examples/flash_attention/example_mha_fwd_bhsd.py`` / ``_bshd.py``) with a plain
  ``T.Pipelined`` loop; the compiler finds the schedule (a TMA producer, a consumer of two warp
  groups, P @ V with P in registers).
* ``ws_mha_fwd``: the same computation with the schedule written out (``T.ws``): the producer
  ``T.ws(0)`` loads Q once and fills ``stages``-deep K and V rings, each guarded by its own
  full/empty barriers; consumers ``T.ws(1)`` and ``T.ws(2)`` each take half of the query rows,
  wait for K right before Q K^T and for V right before P V, and release each right after (the
  schedule the compiler picks for ``mha_fwd``). On Hopper the compiler then keeps P V of one
  block in flight under the next block's softmax, as it does for ``mha_fwd``.

``python examples/attention.py`` runs both on the best target here (the reference interpreter on
a CPU) and checks them against ``torch.nn.functional.scaled_dot_product_attention`` in float32.
"""
from __future__ import annotations

import math
import sys

import torch

import tilews
import tilews.language as T
from tilews.ops.attention import LOG2E, mha_fwd
from tilews.testing import best_device, rel_err, time_ms

def ws_mha_fwd_program(batch, heads, seq_len, dim, is_causal, block_M=128, block_N=128, stages=2,
                       dtype=T.float16):
    """BHSD attention with the schedule written out: producer T.ws(0); consumers T.ws(1) and
    T.ws(2), each with its own half of the query rows and its own fragments, so one warp group's
    softmax runs under the other's gemms (the two meet only at the producer's barriers)."""
    scale = LOG2E / math.sqrt(dim)
    shape = [batch, heads, seq_len, dim]
    accum = T.float32
    half = block_M // 2

    def consumer_fragments():
        """One consumer's scores S, probabilities P, output O, row max m (and the previous one),
        rescale alpha, row sums, running sum l."""
        return (T.alloc_fragment([half, block_N], accum), T.alloc_fragment([half, block_N], dtype),
                T.alloc_fragment([half, dim], accum),
                *(T.alloc_fragment([half], accum) for _ in range(5)))

    @T.prim_func
    def main(Q: T.Tensor(shape, dtype), K: T.Tensor(shape, dtype), V: T.Tensor(shape, dtype),
             Output: T.Tensor(shape, dtype)):
        with T.Kernel(T.ceildiv(seq_len, block_M), heads, batch, threads=384) as (bx, by, bz):
            Q_s = T.alloc_shared([block_M, dim], dtype)
            K_s = T.alloc_shared([stages, block_N, dim], dtype)
            V_s = T.alloc_shared([stages, block_N, dim], dtype)
            O_s = T.alloc_shared([block_M, dim], dtype)
            frags = [consumer_fragments(), consumer_fragments()]
            q_ready = T.alloc_barrier(arrive_count=128)          # the producer warp group
            k_full = T.alloc_barrier([128] * stages)
            k_empty = T.alloc_barrier([256] * stages)            # both consumer warp groups
            v_full = T.alloc_barrier([128] * stages)
            v_empty = T.alloc_barrier([256] * stages)
            if is_causal:
                blocks = T.min(T.ceildiv(seq_len, block_N), T.ceildiv((bx + 1) * block_M, block_N))
            else:
                blocks = T.ceildiv(seq_len, block_N)
            with T.ws(0):
                T.copy(Q[bz, by, bx * block_M, 0], Q_s)
                T.barrier_arrive(q_ready)
                for k in range(blocks):
                    T.barrier_wait(k_empty[k % stages], ((k // stages) & 1) ^ 1)
                    T.copy(K[bz, by, k * block_N, 0], K_s[k % stages, :, :])
                    T.barrier_arrive(k_full[k % stages])
                    T.barrier_wait(v_empty[k % stages], ((k // stages) & 1) ^ 1)
                    T.copy(V[bz, by, k * block_N, 0], V_s[k % stages, :, :])
                    T.barrier_arrive(v_full[k % stages])
            for c, (S, P, O, m, m_prev, alpha, row_sum, l) in enumerate(frags):  # noqa: E741
                row0 = bx * block_M + c * half                   # this consumer's first query row
                with T.ws(1 + c):
                    T.fill(O, 0)
                    T.fill(l, 0)
                    T.fill(m, -T.infinity(accum))
                    T.barrier_wait(q_ready, 0)
                    for k in range(blocks):
                        for i, j in T.Parallel(half, block_N):
                            if is_causal:
                                S[i, j] = T.if_then_else((row0 + i >= k * block_N + j)
                                                         and (k * block_N + j < seq_len), 0, -T.infinity(accum))
                            else:
                                S[i, j] = T.if_then_else(k * block_N + j < seq_len, 0, -T.infinity(accum))
                        T.barrier_wait(k_full[k % stages], (k // stages) & 1)
                        T.gemm(Q_s[c * half:(c + 1) * half, :], K_s[k % stages, :, :], S, transpose_B=True)
                        T.barrier_arrive(k_empty[k % stages])
                        T.copy(m, m_prev)
                        T.reduce_max(S, m, dim=1, clear=False)
                        for i in T.Parallel(half):
                            alpha[i] = T.exp2(m_prev[i] * scale - m[i] * scale)
                        for i, j in T.Parallel(half, block_N):
                            S[i, j] = T.exp2(S[i, j] * scale - m[i] * scale)
                        T.reduce_sum(S, row_sum, dim=1)
                        for i in T.Parallel(half):
                            l[i] = l[i] * alpha[i] + row_sum[i]
                        T.copy(S, P)
                        for i, j in T.Parallel(half, dim):
                            O[i, j] *= alpha[i]
                        T.barrier_wait(v_full[k % stages], (k // stages) & 1)
                        T.gemm(P, V_s[k % stages, :, :], O)
                        T.barrier_arrive(v_empty[k % stages])
                    for i in T.Parallel(half):            # one division per row, not per element
                        l[i] = 1.0 / l[i]
                    for i, j in T.Parallel(half, dim):
                        O[i, j] *= l[i]
                    T.copy(O, O_s[c * half:(c + 1) * half, :])
                    T.copy(O_s[c * half:(c + 1) * half, :], Output[bz, by, row0, 0])
    return main


ws_mha_fwd = tilews.jit(out_idx=[3])(ws_mha_fwd_program)


def reference(q, k, v, is_causal, layout="bhsd"):
    """float32 SDPA on BHSD views."""
    if layout == "bshd":
        q, k, v = (x.transpose(1, 2) for x in (q, k, v))
    out = torch.nn.functional.scaled_dot_product_attention(q.float(), k.float(), v.float(),
                                                           is_causal=is_causal)
    return out.transpose(1, 2) if layout == "bshd" else out


def main(argv=None) -> int:
    device = best_device()
    gpu = device.type == "cuda"
    B, H, S, D = (4, 16, 4096, 128) if gpu else (1, 2, 200, 64)
    blocks = dict(block_M=128, block_N=128) if gpu else dict(block_M=64, block_N=64)
    ok = True
    for name, factory, extra in (("mha_fwd", mha_fwd, dict(num_stages=2, threads=256 if gpu else 128)),
                                 ("ws_mha_fwd", ws_mha_fwd, dict(stages=2))):
        for causal in (False, True):
            kernel = factory(B, H, S, D, causal, **blocks, **extra)
            q, k, v = (torch.randn(B, H, S, D, device=device, dtype=torch.float16) for _ in range(3))
            out = kernel(q, k, v)
            err = rel_err(out, reference(q, k, v, causal))
            flops = 4 * B * H * S * S * D * (0.5 if causal else 1.0)
            ms = time_ms(lambda: kernel(q, k, v), device, reps=10 if gpu else 1)
            print(f"{name} causal={causal} B{B} H{H} S{S} D{D} on '{kernel.target}': {ms:.3f} ms "
                  f"({flops / ms / 1e9:.0f} TFLOP/s), rel err {err:.2e}")
            ok &= err < 1e-2
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
