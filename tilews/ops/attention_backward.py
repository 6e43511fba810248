"""Attention backward (FlashAttention-2's algorithm) written in the tile language: three kernels
behind ``tilews.ops.attention``'s autograd.

1. ``preprocess``: ``Delta = rowsum(dO * O)`` per query row, and dQ's float32 accumulator zeroed.
2. ``main``: one block per K/V block (``block_M`` keys) of one KV head. K and V stay in shared
   memory; a ``T.Pipelined`` loop runs over the query blocks (``block_N`` queries) of every query
   head the KV head serves (GQA: ``group`` heads in turn, so dK and dV of a KV head sum all of
   them in registers, no atomics). Per query block: ``S^T = K Q^T``, ``P^T = exp2(S^T * scale -
   LSE)`` (the forward's base-2 log-sum-exp), ``dP^T = V dO^T``, ``dV += P^T dO``,
   ``dS^T = P^T (dP^T - Delta) / sqrt(D)``, ``dK += dS^T Q``, and ``dQ += dS K`` added into
   float32 by element atomics from registers (dS^T goes through shared memory: the gemm reads it
   transposed), or with ``dq_tile_add`` as a tile through shared memory (on Hopper one bulk
   reduce-add per piece of the head dim; a GPU's choice, ``blocks``). Each K/V block runs its query
   blocks starting from its own, so the blocks of a head do not add into the same dQ rows at the
   same time: rotated by ``bx``, or causal from the diagonal's (already its own; no remainder
   by a run-time count per query block). With ``defer_dq`` a query block's dQ is added during
   the next block, under its first gemms (``backward_block``).
   Causal: query blocks before the K/V block's first key are skipped; a mask runs only on the
   blocks that cross the diagonal.
3. ``postprocess``: dQ cast to the operands' dtype.

On a GPU, non-causal, at D64 and D128 (``SPLIT_HEAD_DIMS``: where it was measured faster), a
last wave of main-kernel blocks at most half full is split
(``tail_split``, ``bwd_program``'s ``tail_units`` / ``tail_parts``): each of its units (a K/V
block of a KV head) runs as several blocks over shares of its query blocks, adding dK and dV
into a zeroed float32 workspace that a small kernel then casts (B4 H32 S4096 D128: 4096 units
on 132 SMs, 31 full waves and 4 units; split, the last wave is 4 x 33 parts of ~2 query blocks
each instead of 4 units of 64). Timed by ``scripts/probe_attention_backward.py --tail``.

The row vectors (LSE, Delta) and dQ's accumulator have ``rows`` rows per head (whole forward query
blocks): rows past the sequence's end hold finite values (zero Q / O / dO rows), so no kernel needs
a mask for them, and their dQ rows are never read back. Every program takes BHSD tensors;
``tilews.ops.attention`` passes BSHD tensors as transposed views.

On Hopper the main kernel is warp-specialized by the compiler: a TMA producer fills a ring of
Q / dO / LSE / Delta slots, one merged consumer role of two warp groups splits the K/V block's
rows (dK, dV and the S^T / dP^T tiles), and the dQ product splits its columns; at D64 (policy
``split_partials``, ``TILEWS_SPLIT_PARTIALS``, on) each warp group is a role of its own over its
64 keys, with its own dQ partial reduce-added (D128's would not fit: one merged role there).
"""
from __future__ import annotations

import functools
import heapq
import math

import torch

import tilews
import tilews.language as T
from tilews.binding import remember
from tilews.lowering import dtypes

from .attention import LOG2E, operand_sizes, tile_rows, varlen_dims


def bwd_preprocess_program(batch, heads, seq_len, dim, rows, block=64, threads=128, dtype=T.float16):
    """``Delta[b, h, r] = sum_d O[b, h, r, d] * dO[b, h, r, d]`` for the ``rows`` rows of each head
    (zero past ``seq_len``), and ``dQ`` (float32, ``rows`` rows) set to zero."""
    shape = [batch, heads, seq_len, dim]
    prepare = preprocess_block(dim, block, "bhsd", dtype)

    @T.prim_func
    def main(O: T.Tensor(shape, dtype), dO: T.Tensor(shape, dtype),
             Delta: T.Tensor([batch, heads, rows], T.float32),
             dQ: T.Tensor([batch, heads, rows, dim], T.float32)):
        with T.Kernel(T.ceildiv(rows, block), heads, batch, threads=threads) as (bx, by, bz):
            prepare(O, dO, Delta, dQ, bx, by, bz, 0)
    return main


def preprocess_block(dim, block, layout, dtype):
    """The macro ``prepare(O, dO, Delta, dQ, bx, by, bz, q_start)``: rows ``[bx * block, (bx + 1)
    * block)`` of head ``by`` of sequence ``bz`` (its first row ``q_start`` of O and dO; Delta and
    dQ [batch, heads, rows, ...] from row 0) of ``bwd_preprocess_program``."""
    f32 = T.float32
    rows = tile_rows(layout)

    @T.macro
    def prepare(O, dO, Delta, dQ, bx, by, bz, q_start):
        o = T.alloc_fragment([block, dim], dtype)
        do = T.alloc_fragment([block, dim], dtype)
        prod = T.alloc_fragment([block, dim], f32)
        delta = T.alloc_fragment([block], f32)
        T.copy(rows(O, bz, by, q_start + bx * block, block), o)
        T.copy(rows(dO, bz, by, q_start + bx * block, block), do)
        for i, j in T.Parallel(block, dim):
            prod[i, j] = T.cast(o[i, j], f32) * T.cast(do[i, j], f32)
        T.reduce_sum(prod, delta, dim=1)
        T.copy(delta, Delta[bz, by, bx * block])
        T.clear(prod)
        T.copy(prod, dQ[bz, by, bx * block, 0])
    return prepare


def bwd_program(batch, heads, kv_heads, seq_len, dim, is_causal, rows, block_M=128, block_N=64,
                num_stages=2, threads=256, dtype=T.float16, dq_tile_add=False, defer_dq=False,
                tail_units=0, tail_parts=1, tail_tile_add=False, order_sms=0):
    """dK and dV of each K/V block (written), dQ added into its float32 accumulator (module
    docstring; ``dq_tile_add``: dQ's tile added through shared memory, else element atomics;
    ``defer_dq``: as ``backward_block``'s).

    ``order_sms`` (causal; ``balanced_order`` makes the order): the kernel is written persistent,
    ``order_sms`` blocks each running units ``block_id, block_id + order_sms, ...`` of the grid,
    unit ``t`` being ``Order[t]`` (an int32 tensor of the units in some order, a parameter after
    ``dV``): the caller chooses which block runs which unit.

    ``tail_units`` (non-causal; ``tail_split`` chooses them): the last ``tail_units`` units (one
    K/V block of one KV head of one sequence, in the grid's bx-fastest order) each run as
    ``tail_parts`` blocks, each over a contiguous share of the unit's query-block iterations,
    so the grid's last wave holds ``tail_units * tail_parts`` short blocks instead of
    ``tail_units`` whole ones. The grid is then one row of blocks: the whole units first, then
    the parts (dispatched last; on Hopper ``persist``'s last round of tiles). A part adds its
    dK and dV into the float32 workspace ``dKV`` [tail_units, 2 (dK, dV), block_M, dim], which
    the caller zeroes: by tile through shared memory where ``tail_tile_add``, else by element
    (``blocks``); a second kernel casts it into dK and dV."""
    shape, kv_shape = [batch, heads, seq_len, dim], [batch, kv_heads, seq_len, dim]
    f32 = T.float32
    group = heads // kv_heads
    grads = backward_block(dim, group, is_causal, block_M, block_N, num_stages, "bhsd",
                           dtype, dq_tile_add=dq_tile_add, defer_dq=defer_dq,
                           split_tail=tail_units > 0, tail_tile_add=tail_tile_add and tail_units > 0)
    key_blocks = T.ceildiv(seq_len, block_M)
    units, trips = units_and_trips(batch, heads, kv_heads, seq_len, block_M, block_N)
    if tail_units and (is_causal or not 0 < tail_units <= units or not 2 <= tail_parts <= trips):
        raise ValueError(f"bwd_program: tail_units={tail_units}, tail_parts={tail_parts}: a split "
                         f"tail needs a non-causal program (is_causal={is_causal}), 0 < tail_units "
                         f"<= {units} units and 2 <= tail_parts <= {trips} query-block iterations")
    whole = units - tail_units
    cast_rows = min(block_M, 32)

    @T.macro
    def unit_block(unit):
        """(bx, by, bz) of ``unit`` in the grid's bx-fastest order."""
        return unit % key_blocks, unit // key_blocks % kv_heads, unit // (key_blocks * kv_heads)

    if order_sms:
        if not is_causal or tail_units:
            raise ValueError(f"bwd_program: order_sms={order_sms} orders a causal program's units "
                             f"(is_causal={is_causal}, tail_units={tail_units})")

        @T.prim_func
        def ordered(Q: T.Tensor(shape, dtype), K: T.Tensor(kv_shape, dtype), V: T.Tensor(kv_shape, dtype),
                    dO: T.Tensor(shape, dtype), LSE: T.Tensor([batch, heads, rows], f32),
                    Delta: T.Tensor([batch, heads, rows], f32), dQ: T.Tensor([batch, heads, rows, dim], f32),
                    dK: T.Tensor(kv_shape, dtype), dV: T.Tensor(kv_shape, dtype),
                    Order: T.Tensor([units], T.int32)):
            with T.Kernel(order_sms, threads=threads) as block_id:
                for t in T.Persistent([units], order_sms, block_id):
                    bx, by, bz = unit_block(Order[t])
                    grads(Q, K, V, dO, LSE, Delta, dQ, dK, dV, bx, by, bz, 0, seq_len, 0, seq_len)
        return ordered

    if not tail_units:
        @T.prim_func
        def main(Q: T.Tensor(shape, dtype), K: T.Tensor(kv_shape, dtype), V: T.Tensor(kv_shape, dtype),
                 dO: T.Tensor(shape, dtype), LSE: T.Tensor([batch, heads, rows], f32),
                 Delta: T.Tensor([batch, heads, rows], f32), dQ: T.Tensor([batch, heads, rows, dim], f32),
                 dK: T.Tensor(kv_shape, dtype), dV: T.Tensor(kv_shape, dtype)):
            with T.Kernel(key_blocks, kv_heads, batch, threads=threads) as (bx, by, bz):
                grads(Q, K, V, dO, LSE, Delta, dQ, dK, dV, bx, by, bz, 0, seq_len, 0, seq_len)
        return main

    @T.prim_func
    def split(Q: T.Tensor(shape, dtype), K: T.Tensor(kv_shape, dtype), V: T.Tensor(kv_shape, dtype),
              dO: T.Tensor(shape, dtype), LSE: T.Tensor([batch, heads, rows], f32),
              Delta: T.Tensor([batch, heads, rows], f32), dQ: T.Tensor([batch, heads, rows, dim], f32),
              dK: T.Tensor(kv_shape, dtype), dV: T.Tensor(kv_shape, dtype),
              dKV: T.Tensor([tail_units, 2, block_M, dim], f32)):
        # one row of a 3-d grid: on a GPU ``persist`` deals a 2-d or 3-d grid's tiles to one
        # block per SM in launch order (the parts in its last round); it keeps a 1-d grid as is
        with T.Kernel(whole + tail_units * tail_parts, 1, 1, threads=threads) as (bid, _, _):
            # a part: its tail unit's slot in dKV and its share of the iterations (a whole unit:
            # slot 0, share 0 and all of them)
            part = T.max(bid - whole, 0)
            slot, share = part // tail_parts, part % tail_parts
            first = share * trips // tail_parts
            count = T.if_then_else(bid < whole, trips, (share + 1) * trips // tail_parts - first)
            bx, by, bz = unit_block(T.min(bid, whole + slot))
            grads(Q, K, V, dO, LSE, Delta, dQ, dK, dV, bx, by, bz, 0, seq_len, 0, seq_len,
                  part=(bid >= whole, slot, first, count, dKV))
        with T.Kernel(block_M // cast_rows, tail_units, threads=128) as (rx, t):
            # the parts' sums cast into dK and dV, ``cast_rows`` rows of each per block
            bx, by, bz = unit_block(whole + t)
            row = bx * block_M + rx * cast_rows
            acc = T.alloc_fragment([cast_rows, dim], f32)
            out = T.alloc_fragment([cast_rows, dim], dtype)
            T.copy(dKV[t, 0, rx * cast_rows, 0], acc)
            T.copy(acc, out)
            T.copy(out, dK[bz, by, row, 0])
            T.copy(dKV[t, 1, rx * cast_rows, 0], acc)
            T.copy(acc, out)
            T.copy(out, dV[bz, by, row, 0])
    return split


def units_and_trips(batch: int, heads: int, kv_heads: int, seq_len: int, block_M: int,
                    block_N: int) -> tuple[int, int]:
    """(the main kernel's units, each unit's query-block iterations) at these sizes and blocks:
    ``tail_split``'s ``units`` and ``trips``, as ``bwd_program`` counts them."""
    return -(-seq_len // block_M) * kv_heads * batch, heads // kv_heads * -(-seq_len // block_N)


SPLIT_HEAD_DIMS = (64, 128)
"""The head dims whose backward the split tail makes faster (H200, B4 H32 / B8 H16, S4096, the
whole backward's GPU time, split / unsplit: D64 0.95-0.97, D128 0.95-0.98). Not the others: with
dQ added by tile, D96's split is 1.03 and D192's 1.06 of the unsplit time (their split kernels
hold the parts' extra shared memory at the cost of the whole units' schedule: D192 is lowered
again for fewer preload slots); D256 not measured (docs/performance.md)."""


ORDER_HEAD_DIMS = (64, 128)
"""The head dims whose causal backward runs its units in ``balanced_order`` (timed there)."""


def op_tail_split(batch: int, heads: int, kv_heads: int, seq_len: int, dim: int, is_causal: bool,
                  cfg: dict, sms: int) -> tuple:
    """The split ``attention_backward`` makes on a GPU of ``sms`` SMs with ``blocks``' ``cfg``:
    ``tail_split`` (one block per SM: the kernel's 384 threads x 168 registers take 64512 of an
    SM's 65536) where the program is non-causal at a head dim of ``SPLIT_HEAD_DIMS``, else
    (0, 1)."""
    if is_causal or dim not in SPLIT_HEAD_DIMS:
        return 0, 1
    units, trips = units_and_trips(batch, heads, kv_heads, seq_len, cfg["block_M"], cfg["block_N"])
    return tail_split(units, sms, trips)


BALANCED_ROUNDS = 4
"""The rounds of units at the end of the causal main kernel that ``balanced_order`` deals
longest first (the earlier ones keep the heads a round's blocks read together)."""


@functools.lru_cache(maxsize=64)
def balanced_order(batch: int, heads: int, kv_heads: int, seq_len: int, block_M: int,
                   block_N: int, sms: int) -> tuple[int, ...]:
    """The causal main kernel's units (``unit_block``'s launch order) in the order
    ``bwd_program(order_sms=sms)`` runs them (block ``b`` takes positions ``b, b + sms, ...``).
    A unit's work is its query-block iterations, fewer the later its keys (``group * (query
    blocks - first)``). Dealt in rounds of consecutive units, alternating direction (persist's
    deal), the blocks' totals spread +-3% around the mean at B4 H32 S4096 (the round structure
    meets the work's slope unevenly), and the kernel lasts as long as the busiest block. So the
    first rounds are dealt that way (a round's blocks read a few heads' Q and dO, which stay in
    L2), and the last ``BALANCED_ROUNDS`` rounds' units go longest first, each to the block with
    the least work so far among those with a position left (LPT): the busiest block's total
    1.031 -> 1.008 of the mean at that shape."""
    units, trips = units_and_trips(batch, heads, kv_heads, seq_len, block_M, block_N)
    key_blocks, group = -(-seq_len // block_M), heads // kv_heads
    work = [trips - group * ((u % key_blocks) * block_M // block_N) for u in range(units)]
    order, load = [0] * units, [0] * sms
    dealt = max(0, -(-units // sms) - BALANCED_ROUNDS) * sms
    for position in range(dealt):
        r, b = divmod(position, sms)
        order[position] = r * sms + (b if r % 2 == 0 else sms - 1 - b)
        load[b] += work[order[position]]
    free = [list(range(dealt + b, units, sms)) for b in range(sms)]
    blocks = [(load[b], b) for b in range(sms) if free[b]]
    heapq.heapify(blocks)
    for unit in sorted(range(dealt, units), key=lambda u: (-work[u], u)):
        total, b = heapq.heappop(blocks)
        order[free[b].pop(0)] = unit
        if free[b]:
            heapq.heappush(blocks, (total + work[unit], b))
    return tuple(order)


def tail_split(units: int, slots: int, trips: int) -> tuple:
    """(tail_units, tail_parts) for ``bwd_program``: ``units`` blocks over ``slots`` resident
    blocks (SMs times blocks per SM) leave a last wave of ``r = units % slots``; where ``0 < r <=
    slots // 2``, those ``r`` units each run as ``min(slots // r, trips)`` parts (``trips``: a
    unit's query-block iterations), so the last wave fills up to ``slots``. Else (0, 1): no
    split (a full last wave, or one more than half full, where parts would gain less than
    their extra prologues and the workspace's adds cost)."""
    r = units % slots
    parts = min(slots // r, trips) if 0 < r <= slots // 2 else 1
    return (r, parts) if parts >= 2 else (0, 1)


def backward_block(dim, group, is_causal, block_M, block_N, num_stages, layout, dtype,
                   sm_scale=None, dq_tile_add=False, defer_dq=False, split_tail=False,
                   tail_tile_add=False):
    """The macro ``grads(Q, K, V, dO, LSE, Delta, dQ, dK, dV, bx, by, bz, q_start, q_len,
    k_start, k_len, part=None)``: keys ``[bx * block_M, (bx + 1) * block_M)`` of KV head ``by`` of sequence
    ``bz`` (module docstring), its queries rows ``q_start + [0, q_len)`` and keys ``k_start + [0,
    k_len)`` of their tensors (as ``attention_block``'s; LSE, Delta and dQ [batch, heads, rows,
    ...] from row 0). Causal keys are aligned to the bottom right (key ``j`` is seen by queries
    ``i >= j - (k_len - q_len)``).

    ``"varlen"``: the rows past a sequence's end belong to the next one, so a block that reaches
    past ``k_len`` or ``q_len`` masks those keys and queries out of P, dK and dV are stored only
    for keys below ``k_len``, and a block past the end (``bx * block_M >= k_len``) runs no query
    block and stores nothing. ``sm_scale``: the forward's (default ``1 / sqrt(dim)``).

    ``defer_dq`` (not varlen, whose blocks may run no query block): each query block's dQ is
    added during the next one, after that block's ``S^T`` and ``dP^T`` gemms are issued (a copy
    of dQ's accumulator kept meanwhile), the last after the loop, so on Hopper dQ's shared store,
    fence, barriers and reduce-add run under those gemms instead of between the blocks, where
    no gemm is in flight (sm_90a D64: 20 more instructions per query block, a copy and the
    branch; D128 spills 224-396 bytes that way).

    ``split_tail`` (not varlen): ``grads`` takes ``part=(added, slot, start, count, dKV)``,
    run-time values: the block runs iterations ``[start, start + count)`` of its loop over
    query blocks; unless ``added`` it stores dK and dV, else adds them into ``dKV[slot, 0]`` and
    ``dKV[slot, 1]`` (float32 [block_M, dim]; ``bwd_program``'s split tail): with
    ``tail_tile_add`` each as one tile through shared memory (on Hopper a bulk reduce-add), else
    by element."""
    if tail_tile_add and not split_tail:
        raise ValueError("backward_block: tail_tile_add needs split_tail")
    if (defer_dq or split_tail) and layout == "varlen":
        raise ValueError("backward_block: defer_dq and split_tail need whole sequences (layout 'bhsd')")
    sm_scale = 1.0 / math.sqrt(dim) if sm_scale is None else sm_scale
    scale = sm_scale * LOG2E
    f32 = T.float32
    varlen = layout == "varlen"
    rows = tile_rows(layout)
    own_first = is_causal and not varlen and block_M >= block_N

    @T.macro
    def seen(key, query, offset, q_len, k_len):
        """Whether ``query`` sees ``key`` (both within their sequences where varlen)."""
        if varlen and is_causal:
            return key <= query + offset and key < k_len and query < q_len
        elif varlen:
            return key < k_len and query < q_len
        else:
            return key <= query

    @T.macro
    def masked(kb, bx, offset, q_len, k_len):
        """Whether query block ``kb`` and key block ``bx`` hold a pair ``seen`` refuses."""
        if varlen and is_causal:
            return (kb * block_N + offset < bx * block_M + block_M - 1 or (bx + 1) * block_M > k_len
                    or (kb + 1) * block_N > q_len)
        elif varlen:
            return (bx + 1) * block_M > k_len or (kb + 1) * block_N > q_len
        else:
            return kb * block_N < bx * block_M + block_M - 1      # keys after the query

    @T.macro
    def row_vector(src, staging, dst):
        """``dst`` = the query block's LSE or Delta at ``src``, through ``staging`` where given."""
        if staging is None:
            T.copy(src, dst)
        else:
            T.copy(src, staging)
            T.copy(staging, dst)

    @T.macro
    def query_block(it, by, bx, first, per_head, start):
        """(query head, query block) of iteration ``start + it``: each K/V block starts at its own query
        block, so the blocks of one head do not all add into the same dQ rows at once: causal
        (not varlen, whose first blocks may all be 0) with ``block_M >= block_N`` (no two K/V
        blocks share a diagonal query block), the first query block already differs (the
        diagonal's); else rotated by ``bx``."""
        it = it + start if split_tail else it
        h = by * group + it // per_head if group > 1 else by
        step = it % per_head if group > 1 else it
        return h, first + (step if own_first else (step + bx) % per_head)

    @T.macro
    def dp_gemm(dO, Delta, dO_s, delta_s, delta, V_s, dpT, bz, h, q_start, kb):
        """``dP^T = V dO^T`` of query block ``kb`` of head ``h``, its Delta loaded."""
        T.copy(rows(dO, bz, h, q_start + kb * block_N, block_N), dO_s)
        row_vector(Delta[bz, h, kb * block_N], delta_s, delta)
        T.gemm(V_s, dO_s, dpT, transpose_B=True, clear_accum=True)

    @T.macro
    def add_tile(dst, a, b, row, src, staging, extent):
        """``dst[a, b, row + i, j] += src[i, j]`` (float32 [extent, dim]): one tile through shared
        ``staging`` where given, else by element."""
        if staging is not None:
            T.copy(src, staging)
            T.atomic_add(dst[a, b, row, 0], staging)
        else:
            for i, j in T.Parallel(extent, dim):
                T.atomic_add(dst[a, b, row + i, j], src[i, j])

    @T.macro
    def add_dq(dQ, dq, dq_s, bz, h, kb):
        """dQ's rows of query block ``kb`` of head ``h`` += ``dq``."""
        add_tile(dQ, bz, h, kb * block_N, dq, dq_s, block_N)

    @T.macro
    def store_kv(dK, dV, dk, dv, bx, by, bz):
        T.copy(dv, dV[bz, by, bx * block_M, 0])
        T.copy(dk, dK[bz, by, bx * block_M, 0])

    @T.macro
    def grads(Q, K, V, dO, LSE, Delta, dQ, dK, dV, bx, by, bz, q_start, q_len, k_start, k_len,
              part=None):
        offset = k_len - q_len
        K_s = T.alloc_shared([block_M, dim], dtype)
        V_s = T.alloc_shared([block_M, dim], dtype)
        Q_s = T.alloc_shared([block_N, dim], dtype)
        dO_s = T.alloc_shared([block_N, dim], dtype)
        dsT_s = T.alloc_shared([block_M, block_N], dtype)
        dq_s = T.alloc_shared([block_N, dim], f32) if dq_tile_add else None
        part_s = T.alloc_shared([block_M, dim], f32) if tail_tile_add else None
        # LSE and Delta through shared memory: on Hopper the producer loads them with Q and dO
        # (the consumer's element loads wait behind its dQ atomics). Varlen's row vectors have
        # a runtime length, which a bulk copy cannot describe: loaded by element there.
        lse_s = None if varlen else T.alloc_shared([block_N], f32)
        delta_s = None if varlen else T.alloc_shared([block_N], f32)
        lse = T.alloc_fragment([block_N], f32)
        delta = T.alloc_fragment([block_N], f32)
        sT = T.alloc_fragment([block_M, block_N], f32)
        dpT = T.alloc_fragment([block_M, block_N], f32)
        pT = T.alloc_fragment([block_M, block_N], dtype)
        dsT = T.alloc_fragment([block_M, block_N], dtype)
        dk = T.alloc_fragment([block_M, dim], f32)
        dv = T.alloc_fragment([block_M, dim], f32)
        dq = T.alloc_fragment([block_N, dim], f32)
        dq_prev = T.alloc_fragment([block_N, dim], f32) if defer_dq else None

        T.copy(rows(K, bz, by, k_start + bx * block_M, block_M), K_s)
        T.copy(rows(V, bz, by, k_start + bx * block_M, block_M), V_s)
        T.clear(dk)
        T.clear(dv)
        if varlen and is_causal:
            first = T.max(bx * block_M - offset, 0) // block_N
        elif is_causal:
            first = (bx * block_M) // block_N
        else:
            first = 0
        per_head = T.ceildiv(q_len, block_N) - first
        start = 0
        if split_tail:
            added, slot, start, trips, dKV = part
        elif varlen:
            # the warp-specialized pipeline needs its loop at the kernel's top level: a block
            # past the sequence's end runs it zero times instead of returning
            trips = T.if_then_else(bx * block_M < k_len, group * per_head, 0)
        else:
            trips = group * per_head
        # a split tail's part runs iterations [start, start + trips) (a loop from 0: a loop from
        # start adds 2 sm_90a instructions per query block, its bounds' arithmetic)
        for it in T.Pipelined(trips, num_stages=num_stages):
            h, kb = query_block(it, by, bx, first, per_head, start)
            T.copy(rows(Q, bz, h, q_start + kb * block_N, block_N), Q_s)
            row_vector(LSE[bz, h, kb * block_N], lse_s, lse)
            T.gemm(K_s, Q_s, sT, transpose_B=True, clear_accum=True)
            if defer_dq:
                dp_gemm(dO, Delta, dO_s, delta_s, delta, V_s, dpT, bz, h, q_start, kb)
                # the previous query block's dQ, under this block's first two gemms
                if it > 0:
                    h_prev, kb_prev = query_block(it - 1, by, bx, first, per_head, start)
                    add_dq(dQ, dq_prev, dq_s, bz, h_prev, kb_prev)
            for i, j in T.Parallel(block_M, block_N):
                sT[i, j] = T.exp2(sT[i, j] * scale - lse[j])
            if is_causal or varlen:
                # only in the blocks that hold such pairs
                if masked(kb, bx, offset, q_len, k_len):
                    for i, j in T.Parallel(block_M, block_N):
                        sT[i, j] = T.if_then_else(seen(bx * block_M + i, kb * block_N + j, offset,
                                                       q_len, k_len), sT[i, j], 0)
            if not defer_dq:
                dp_gemm(dO, Delta, dO_s, delta_s, delta, V_s, dpT, bz, h, q_start, kb)
            T.copy(sT, pT)
            T.gemm(pT, dO_s, dv)
            for i, j in T.Parallel(block_M, block_N):
                dsT[i, j] = sT[i, j] * (dpT[i, j] - delta[j]) * sm_scale
            T.gemm(dsT, Q_s, dk)
            T.copy(dsT, dsT_s)
            T.gemm(dsT_s, K_s, dq, transpose_A=True, clear_accum=True)
            if defer_dq:
                T.copy(dq, dq_prev)
            else:
                add_dq(dQ, dq, dq_s, bz, h, kb)
        if defer_dq:
            h_last, kb_last = query_block(trips - 1, by, bx, first, per_head, start)
            add_dq(dQ, dq_prev, dq_s, bz, h_last, kb_last)
        if varlen:
            # the keys below k_len, from registers (a TMA store would write whole rows)
            for i, j in T.Parallel(block_M, dim):
                if bx * block_M + i < k_len:
                    dV[k_start + bx * block_M + i, by, j] = T.cast(dv[i, j], dtype)
            for i, j in T.Parallel(block_M, dim):
                if bx * block_M + i < k_len:
                    dK[k_start + bx * block_M + i, by, j] = T.cast(dk[i, j], dtype)
        elif split_tail:
            if not added:
                store_kv(dK, dV, dk, dv, bx, by, bz)
            else:
                # a part of a split unit: its share of dK and dV added into the workspace
                add_tile(dKV, slot, 1, 0, dv, part_s, block_M)
                add_tile(dKV, slot, 0, 0, dk, part_s, block_M)
        else:
            store_kv(dK, dV, dk, dv, bx, by, bz)
    return grads


def bwd_postprocess_program(batch, heads, seq_len, dim, rows, block=64, threads=128, dtype=T.float16):
    """``dQ_out = dQ[:, :, :seq_len]`` in ``dtype``."""
    f32 = T.float32

    @T.prim_func
    def main(dQ: T.Tensor([batch, heads, rows, dim], f32),
             dQ_out: T.Tensor([batch, heads, seq_len, dim], dtype)):
        with T.Kernel(T.ceildiv(seq_len, block), heads, batch, threads=threads) as (bx, by, bz):
            acc = T.alloc_fragment([block, dim], f32)
            out = T.alloc_fragment([block, dim], dtype)
            T.copy(dQ[bz, by, bx * block, 0], acc)
            T.copy(acc, out)
            T.copy(out, dQ_out[bz, by, bx * block, 0])
    return main


def bwd_varlen_preprocess_program(heads, dim, block=64, threads=128, dtype=T.float16):
    """``bwd_preprocess_program`` over packed sequences: O and dO [total_q, heads, dim], Delta and
    dQ [batch, heads, lse_rows(, dim)] (each sequence's rows from 0, as the forward's LSE)."""
    seqs, batch, total_q, _, padded = varlen_dims()
    shape, f32 = [total_q, heads, dim], T.float32
    prepare = preprocess_block(dim, block, "varlen", dtype)

    @T.prim_func
    def main(O: T.Tensor(shape, dtype), dO: T.Tensor(shape, dtype),
             cu_seqlens_q: T.Tensor([seqs], T.int32),
             Delta: T.Tensor([batch, heads, padded], f32), dQ: T.Tensor([batch, heads, padded, dim], f32)):
        with T.Kernel(T.ceildiv(T.dynamic("lse_rows"), block), heads, T.dynamic("batch"),
                      threads=threads) as (bx, by, bz):
            prepare(O, dO, Delta, dQ, bx, by, bz, cu_seqlens_q[bz])
    return main


def bwd_varlen_program(heads, kv_heads, dim, is_causal, block_M=128, block_N=64, num_stages=2,
                       threads=256, dtype=T.float16, sm_scale=None):
    """``bwd_program`` over packed sequences (``mha_fwd_varlen_program``'s tensors; the grid: one
    block per ``block_M`` keys of the longest sequence, ``max_seqlen_k``)."""
    seqs, batch, total_q, total_k, padded = varlen_dims()
    shape, kv_shape, f32 = [total_q, heads, dim], [total_k, kv_heads, dim], T.float32
    grads = backward_block(dim, heads // kv_heads, is_causal, block_M, block_N, num_stages,
                           "varlen", dtype, sm_scale)

    @T.prim_func
    def main(Q: T.Tensor(shape, dtype), K: T.Tensor(kv_shape, dtype), V: T.Tensor(kv_shape, dtype),
             dO: T.Tensor(shape, dtype), cu_seqlens_q: T.Tensor([seqs], T.int32),
             cu_seqlens_k: T.Tensor([seqs], T.int32), max_seqlen_k: T.int32,
             LSE: T.Tensor([batch, heads, padded], f32), Delta: T.Tensor([batch, heads, padded], f32),
             dQ: T.Tensor([batch, heads, padded, dim], f32),
             dK: T.Tensor(kv_shape, dtype), dV: T.Tensor(kv_shape, dtype)):
        with T.Kernel(T.ceildiv(max_seqlen_k, block_M), kv_heads, T.dynamic("batch"),
                      threads=threads) as (bx, by, bz):
            q_start = cu_seqlens_q[bz]
            k_start = cu_seqlens_k[bz]
            grads(Q, K, V, dO, LSE, Delta, dQ, dK, dV, bx, by, bz, q_start,
                  cu_seqlens_q[bz + 1] - q_start, k_start, cu_seqlens_k[bz + 1] - k_start)
    return main


def bwd_varlen_postprocess_program(heads, dim, block=64, threads=128, dtype=T.float16):
    """``dQ_out`` [total_q, heads, dim]: each sequence's rows of dQ [batch, heads, lse_rows, dim]
    in ``dtype``."""
    seqs, batch, total_q, _, padded = varlen_dims()

    @T.prim_func
    def main(dQ: T.Tensor([batch, heads, padded, dim], T.float32), cu_seqlens_q: T.Tensor([seqs], T.int32),
             dQ_out: T.Tensor([total_q, heads, dim], dtype)):
        with T.Kernel(T.ceildiv(T.dynamic("lse_rows"), block), heads, T.dynamic("batch"),
                      threads=threads) as (bx, by, bz):
            acc = T.alloc_fragment([block, dim], T.float32)
            q_start = cu_seqlens_q[bz]
            T.copy(dQ[bz, by, bx * block, 0], acc)
            for i, j in T.Parallel(block, dim):
                if bx * block + i < cu_seqlens_q[bz + 1] - q_start:
                    dQ_out[q_start + bx * block + i, by, j] = T.cast(acc[i, j], dtype)
    return main


@functools.lru_cache(maxsize=None)
def kernels(target: str = "auto") -> tuple:
    """The backward's three kernel factories (preprocess, main, postprocess) for ``target``."""
    return tuple(tilews.jit(target=target)(p)
                 for p in (bwd_preprocess_program, bwd_program, bwd_postprocess_program))


def blocks(dim: int, gpu: bool, varlen: bool = False) -> dict:
    """The main kernel's blocks, threads, ring depth and dQ form for head dim ``dim``: 128 keys x
    64 queries over two consumer warp groups on a GPU (64 keys above D = 128, where dK and dV of
    128 rows would not fit the registers), 64 x 32 on the CPU's interpreter. On a GPU, dQ's tile
    is added through shared memory (``dq_tile_add``; on Hopper one bulk reduce-add per query
    block, H200, D128: the main kernel 5.2 ms against 6.7 ms with element atomics, which wait in
    the load/store queue; docs/performance.md) where the head dim is a power of two, and at D96
    and D192, one per piece of split_extents' (64 + 32, 128 + 64; both compile warp-specialized
    without spills); other head dims (not compiled that way) add by element, and so does
    ``varlen`` (its dQ rows have a runtime extent, which no bulk copy describes; its program
    takes no ``dq_tile_add``). A split tail's parts add dK and dV by tile (``tail_tile_add``)
    where dQ's tile is and the float32 staging tile takes at most 32 KB (D64); D128's 64 KB,
    beside the persistent kernel's buffers, would leave the whole units' dK / dV stores no
    shared staging (246864 > 232448 bytes), and D96's and D192's 48 KB would leave the preloads
    one slot (D192 the query-block ring one slot too): by element there."""
    if not gpu:
        return dict(block_M=64, block_N=32, threads=128, num_stages=2)
    tiles = dict(block_M=64, block_N=64, threads=256, num_stages=1) if dim > 128 else \
        dict(block_M=128, block_N=64, threads=256, num_stages=2)
    tile_add = dim & (dim - 1) == 0 or dim in (96, 192)
    return tiles if varlen else dict(tiles, dq_tile_add=tile_add,
                                     tail_tile_add=tile_add and tiles["block_M"] * dim * 4 <= 32768)


def attention_backward(grad_out, q, k, v, out, lse, is_causal: bool, layout: str,
                       target: str = "auto", split_tail: bool = True):
    """(dq, dk, dv) of ``tilews.ops.attention(q, k, v, is_causal, layout)`` given the output's
    gradient, the output and the forward's base-2 log-sum-exp (``lse``, [batch, heads, rows]),
    computed by the kernels compiled for ``target``. On a GPU, non-causal, at ``SPLIT_HEAD_DIMS``,
    the main kernel's last wave is split (``tail_split`` over the device's SMs) unless
    ``split_tail`` is False."""
    batch, heads, seq_len, dim, kv_heads = operand_sizes(q, k, layout)
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    if seq_len == 0 or batch == 0 or heads == 0:
        return dq, dk.zero_(), dv.zero_()
    bhsd = (lambda t: t) if layout == "bhsd" else (lambda t: t.transpose(1, 2))
    q, k, v, out, dq, dk, dv = map(bhsd, (q, k, v, out, dq, dk, dv))
    grad_out = bhsd(grad_out.to(q.dtype))
    gpu, dtype, rows = q.device.type == "cuda", dtypes.from_torch(q.dtype), lse.shape[-1]
    delta = lse.new_empty(lse.shape)
    dq_acc = lse.new_empty((batch, heads, rows, dim))
    bwd_preprocess, bwd, bwd_postprocess = kernels(target)
    bwd_preprocess(batch, heads, seq_len, dim, rows, dtype=dtype)(out, grad_out, delta, dq_acc)
    cfg, workspace = blocks(dim, gpu), ()
    if gpu and split_tail:
        # the SMs ``persist`` deals the main kernel's tiles to (tilews.num_sms: the current device's)
        tail_units, tail_parts = op_tail_split(batch, heads, kv_heads, seq_len, dim, is_causal, cfg,
                                               tilews.num_sms())
        if tail_units:
            cfg.update(tail_units=tail_units, tail_parts=tail_parts)
            workspace = (torch.zeros((tail_units, 2, cfg["block_M"], dim), device=q.device),)
    if gpu and is_causal and dim in ORDER_HEAD_DIMS:
        sms = tilews.num_sms()
        cfg.update(order_sms=sms)
        workspace = (_order_tensor((batch, heads, kv_heads, seq_len, cfg["block_M"], cfg["block_N"],
                                    sms), q.device),)
    bwd(batch, heads, kv_heads, seq_len, dim, is_causal, rows, dtype=dtype,
        **cfg)(q, k, v, grad_out, lse, delta, dq_acc, dk, dv, *workspace)
    bwd_postprocess(batch, heads, seq_len, dim, rows, dtype=dtype)(dq_acc, dq)
    return tuple(t if layout == "bhsd" else t.transpose(1, 2) for t in (dq, dk, dv))


_orders: dict = {}


def _order_tensor(sizes: tuple, device: torch.device) -> torch.Tensor:
    """``balanced_order(*sizes)`` as an int32 tensor on ``device`` (made once per sizes and
    device; the cache bounded as every per-call-signature cache, ``remember``)."""
    key = (sizes, device)
    found = _orders.get(key)
    if found is None:
        found = remember(_orders, key, torch.tensor(balanced_order(*sizes), dtype=torch.int32,
                                                    device=device))
    return found


@torch.library.custom_op("tilews::attention_backward", mutates_args=(),
                         schema="(Tensor grad_out, Tensor q, Tensor k, Tensor v, Tensor out, Tensor lse, "
                                "bool is_causal, str layout) -> (Tensor, Tensor, Tensor)")
def _attention_backward_op(grad_out, q, k, v, out, lse, is_causal, layout):
    return attention_backward(grad_out, q, k, v, out, lse, is_causal, layout)


@_attention_backward_op.register_fake
def _attention_backward_fake(grad_out, q, k, v, out, lse, is_causal, layout):
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
