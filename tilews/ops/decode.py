"""Decode attention over a KV cache as ready-made ops, written in the tile language as TileLang's
``flash_decoding`` and ``deepseek_mla`` examples are: ``decode_attention`` (GQA, FlashAttention's
``flash_attn_with_kvcache`` conventions) and ``mla_decode`` (DeepSeek's multi-head latent
attention: one latent KV head that is both K, with its rotary part, and V).

A decode step has one (or a few) query tokens per sequence, so one block per (sequence, KV head)
leaves most SMs idle. Both ops pack the query heads that share a KV head into the rows of one
tile (``block_H`` rows, ``valid`` of them real) and split each sequence's K/V blocks among
``num_splits`` blocks (flash decoding): the split kernel writes each split's output, already
divided by its own softmax sum, and that sum's log (base 2, plus the row maximum) to float32
workspaces (``T.alloc_global``: the function's own, kept by the runtime between calls of one
shape on one stream); the combine weighs the splits by ``exp2(lse - max)``. The combine is done
by the split kernel itself (``settle_program``, as ``gemm_programs.split_k_fused`` sums split-K
partials): each split block counts itself in a per-row-tile arrival counter (the current
stream's ``arrivals.arrival_counters``, passed as the kernel's ``Arrivals``), and the last to
arrive merges the tile's splits in split order (the same bits whichever block is last) and puts
the counter back to 0 — one launch, not two (at batch 1 the second kernel's launch was most of
the gap to cuDNN). On Metal, whose atomics return nothing, the combine stays a second kernel
(``combine_program``) in the same function (``fuses_combine``). With one split the split kernel
writes the output itself and there is no combine.

Each split owns the same static share of the cache's K/V blocks (``split_range``: a block's start
stays a linear function of the split and the loop index); a sequence shorter than the cache
leaves its last splits fewer blocks or none, and a split with no block writes ``lse = -inf`` and
zeros. A zero-length sequence gives zeros.

``cache_seqlens=None`` compiles the cache's whole extent as a constant trip count (no lengths
read from memory, so the Hopper lowering may keep one block per SM over several tiles); given
lengths, the trip count is read per sequence. Paged caches index K/V through ``block_table``;
the K/V block (``block_N``) divides the page.

On Hopper the split kernel stays warp-specialized (a TMA producer for Q, K and V; S = Q K^T, the
softmax and P V in the consumer; the consumer's tail stores the partial from registers, counts
the block and merges). ``num_splits=None`` picks the
split count from the grid, the cache length and ``tilews.targets.num_sms()``
(``choose_num_splits``).

Calling: the first call of a kind (each tensor argument's shape, strides, dtype and device, or
its absence; ``num_splits`` and ``softmax_scale``, each with its type; ``target``) checks the
arguments (errors name the parameter), picks the split count and the compiled kernel, and keeps
a call for the kind: the query's packing (one view for one query token), the kernel's last
inputs (lengths, the block table: ``_tail``), and the kernel's argument binding fixed
to the signature its inputs have (``Kernel.bound``; TMA operands' alignment is still checked per
call). A later call of the kind is one key, one dict lookup and that call, with no check, split
choice or kernel look-up of its own; data, lengths and block tables are read from each call's
tensors (``tests/test_decode_calls.py``: launches stubbed, this CPU, B1 ragged GQA with two
splits: 6.8 us per call against 4.2 us for calling the kernel, 18.5 us before calls were kept;
CPU tensors' lengths and pages are also checked per call, ~3 us more: ``_tail``).
At most ``binding.SIGNATURES`` kinds are kept (then it starts over). The split count of a kept
GPU call is the one chosen for the current device at its first call.

Timing on a GPU: ``tilews-bench decode --preset gpu`` (``--preset mla`` for MLA);
``python scripts/probe_decode_splits.py --rounds 5``: split counts, rings and both combine forms
beside SDPA's backends; ``python scripts/profile_calls.py``: the host time of a call.
"""
from __future__ import annotations

import functools
import math
from typing import Callable, Optional

import torch

import tilews
import tilews.language as T
from tilews import targets
from tilews.binding import remember
from tilews.lowering import dtypes

from .arrivals import arrival_counters
from .attention import LOG2E
from .gemm_programs import ARRIVAL_SLOTS
MIN_BLOCKS_PER_SPLIT = 4        # a split shorter than this spends more on its prologue than it saves
MAX_SPLITS = 64
UNROLLED_SPLITS = 16    # splits whose partials a merge loads at once (MLA's 32 at once spill at D 512)
SPLIT_PROLOGUE = 2.0        # a split block's fixed cost (Q load, ring fill, its partial's store) in K/V blocks
# a split whose sequence has no block left writes lse = -inf; the combine starts its running
# maximum here (not at -inf) so that exp2(lse - max) is 0, never NaN, when every split is empty
_NO_MAX = -1.0e30


@functools.lru_cache(maxsize=1024)
def choose_num_splits(tiles: int, cache_len: int, block_N: int, num_sms: int) -> int:
    """Splits per sequence for ``tiles`` blocks of work (batch x KV heads x row tiles) over a
    cache of ``cache_len`` keys in ``block_N`` blocks: the count whose grid finishes first by a
    model of one block per SM (each split block costs its K/V blocks plus ``SPLIT_PROLOGUE``,
    the grid runs in whole waves of ``num_sms`` blocks), each split at least
    ``MIN_BLOCKS_PER_SPLIT`` K/V blocks long, at most ``MAX_SPLITS``; ties go to fewer splits.
    Whole waves matter: 64 tiles on 132 SMs in 3 splits (the count that merely covered the SMs,
    this function's former rule) are 192 blocks, two waves of which the second is half empty."""
    blocks = math.ceil(cache_len / block_N)
    most = min(blocks // MIN_BLOCKS_PER_SPLIT, MAX_SPLITS)
    if tiles <= 0 or most <= 1:
        return 1

    def time(splits: int) -> float:
        return math.ceil(tiles * splits / num_sms) * (blocks / splits + SPLIT_PROLOGUE)
    return min(range(1, most + 1), key=lambda s: (time(s), s))


def split_range(splits: int, block_N: int, cache_len: int):
    """A macro: the first K/V block and the block count of split ``sid`` of a ``length``-key
    sequence. Each split owns the same static share of the cache's blocks (FlashAttention's
    split-KV: a block's start stays a linear function of the split and the loop index); a
    sequence shorter than the cache leaves its last splits fewer blocks, or none."""
    per = math.ceil(math.ceil(cache_len / block_N) / splits)

    @T.macro
    def blocks_of(length, sid):
        return sid * per, T.max(T.min(T.ceildiv(length, block_N) - sid * per, per), 0)

    @T.macro
    def all_blocks(length, sid):
        return 0, T.ceildiv(length, block_N)
    return all_blocks if splits == 1 else blocks_of


def merge_program(dim: int, splits: int, block_R: int):
    """A macro: ``merge(O_part, LSE, Out, b, first, end)`` stores rows ``first ..
    first + block_R`` (those below ``end``) of ``Out[b]``, the ``splits`` partial outputs
    ``O_part[b, s, r, :]`` (float32, each normalized by its own sum) weighed by their
    log-sum-exps ``LSE[b, s, r]`` (base 2), summed in split order. The sum's loop is unrolled
    in groups of ``UNROLLED_SPLITS``: a group's loads are issued together."""
    f32 = T.float32
    whole = splits - splits % UNROLLED_SPLITS

    @T.macro
    def add(O_part, LSE, b, first, s, top, lse, part, weight, total, acc):
        T.copy(LSE[b, s, first:first + block_R], lse)
        T.copy(O_part[b, s, first:first + block_R, :], part)
        for i in T.Parallel(block_R):
            weight[i] = T.exp2(lse[i] - top[i])
            total[i] += weight[i]
        for i, j in T.Parallel(block_R, dim):
            acc[i, j] += part[i, j] * weight[i]

    @T.macro
    def merge(O_part, LSE, Out, b, first, end):
        part = T.alloc_fragment([block_R, dim], f32)
        acc = T.alloc_fragment([block_R, dim], f32)
        lse = T.alloc_fragment([block_R], f32)
        top = T.alloc_fragment([block_R], f32)
        weight = T.alloc_fragment([block_R], f32)
        total = T.alloc_fragment([block_R], f32)
        T.fill(top, _NO_MAX)
        for s in T.serial(splits):
            T.copy(LSE[b, s, first:first + block_R], lse)
            for i in T.Parallel(block_R):
                top[i] = T.max(top[i], lse[i])
        T.fill(total, 0)
        T.fill(acc, 0)
        if whole:
            for g in T.serial(whole // UNROLLED_SPLITS):
                for u in T.unroll(UNROLLED_SPLITS):
                    add(O_part, LSE, b, first, g * UNROLLED_SPLITS + u, top, lse, part, weight, total, acc)
        if splits > whole:
            for u in T.unroll(splits - whole):
                add(O_part, LSE, b, first, whole + u, top, lse, part, weight, total, acc)
        for i in T.Parallel(block_R):      # the largest weight is 1: total >= 1 unless empty
            total[i] = 1.0 / T.max(total[i], 1.0)
        for i, j in T.Parallel(block_R, dim):
            if first + i < end:
                Out[b, first + i, j] = acc[i, j] * total[i]

    return merge


def combine_program(batch: int, rows: int, dim: int, splits: int, block_R: int = 16):
    """The combine kernel as a macro: ``Out[b, r, :]`` of every row from the splits' partials
    (``merge_program``), one block per ``block_R`` rows of a sequence."""
    merge = merge_program(dim, splits, block_R)

    @T.macro
    def combine(O_part, LSE, Out):
        with T.Kernel(T.ceildiv(rows, block_R), batch, threads=128) as (rt, b):
            merge(O_part, LSE, Out, b, rt * block_R, rows)

    return combine


def settle_program(heads: int, valid: int, dim: int, splits: int):
    """A macro: ``settle(O_part, LSE, Out, Arrivals, hb, b)``, the end of split block (``hb``,
    ``b``)'s work once it has stored its partial and log-sum-exp: it counts itself in
    ``Arrivals[tile]`` (acq_rel; one counter per (sequence, row tile), ``b`` major); the block
    that sees ``splits - 1`` there arrived last, so every split's partial is visible to it: it
    merges the tile's ``valid`` rows (``merge_program``, in split order: the same bits whichever
    block is last) and puts the count back to 0. Contract: ``Arrivals`` holds zeros at launch,
    at least ``batch * heads // valid`` of them, and no other launch uses it meanwhile
    (``arrivals.arrival_counters``: one per stream)."""
    block_R = min(16, 1 << (valid - 1).bit_length())
    merge = merge_program(dim, splits, block_R)

    @T.macro
    def settle(O_part, LSE, Out, Arrivals, hb, b):
        tile = b * (heads // valid) + hb
        arrived = T.atomic_add(Arrivals[tile], 1, memory_order="acq_rel", return_prev=True)
        if arrived == splits - 1:
            for c in T.serial(T.ceildiv(valid, block_R)):
                merge(O_part, LSE, Out, b, hb * valid + c * block_R, (hb + 1) * valid)
            T.atomic_add(Arrivals[tile], -splits)

    return settle


def _shapes(batch, heads, dim, cache, page):
    """Q / Out and K / V tensor shapes: ``cache`` is (keys, kv_heads); ``page`` is None (dense
    [batch, keys, kv_heads, dim]) or (num_pages, page_size) (paged)."""
    keys, kv_heads = cache
    kv = [batch, keys, kv_heads, dim] if page is None else [page[0], page[1], kv_heads, dim]
    return [batch, heads, dim], kv


def signatures(kernel_of, batch: int, heads: int, dims: tuple, cache: tuple, page, ragged: bool,
               dtype):
    """The prim_func for ``kernel_of(Q, Q_pe, K, K_pe, V, lengths, table, Arrivals, Out)`` (a
    macro) over a cache of ``cache`` = (keys, kv_heads) (paged: keys = pages per sequence x page
    size) with the parameters this case has: ``Q_pe`` / ``K_pe`` with a rotary dim
    (``dims[1]``), ``V`` without one (MLA's V is its K), ``lengths`` when ragged, ``table`` when
    paged; always ``Arrivals`` (int32 counters, any number: the fused combine's)."""
    dim, pe_dim = dims
    q_shape, kv_shape = _shapes(batch, heads, dim, cache, page)
    qpe_shape, kpe_shape = _shapes(batch, heads, pe_dim or 1, cache, page)
    Q_t, K_t = T.Tensor(q_shape, dtype), T.Tensor(kv_shape, dtype)
    Qpe_t, Kpe_t = T.Tensor(qpe_shape, dtype), T.Tensor(kpe_shape, dtype)
    Len_t = T.Tensor([batch], T.int32)
    Tab_t = T.Tensor([batch, cache[0] // page[1] if page else 1], T.int32)
    Arr_t = T.Tensor([ARRIVAL_SLOTS], T.int32)
    if pe_dim:
        if page is not None:
            @T.prim_func
            def mla_paged(Q: Q_t, Q_pe: Qpe_t, KV: K_t, K_pe: Kpe_t, cache_seqlens: Len_t,
                          block_table: Tab_t, Arrivals: Arr_t, Out: Q_t):
                kernel_of(Q, Q_pe, KV, K_pe, KV, cache_seqlens, block_table, Arrivals, Out)
            return mla_paged
        if ragged:
            @T.prim_func
            def mla_ragged(Q: Q_t, Q_pe: Qpe_t, KV: K_t, K_pe: Kpe_t, cache_seqlens: Len_t, Arrivals: Arr_t, Out: Q_t):
                kernel_of(Q, Q_pe, KV, K_pe, KV, cache_seqlens, None, Arrivals, Out)
            return mla_ragged

        @T.prim_func
        def mla(Q: Q_t, Q_pe: Qpe_t, KV: K_t, K_pe: Kpe_t, Arrivals: Arr_t, Out: Q_t):
            kernel_of(Q, Q_pe, KV, K_pe, KV, None, None, Arrivals, Out)
        return mla
    if page is not None:
        @T.prim_func
        def decode_paged(Q: Q_t, K: K_t, V: K_t, cache_seqlens: Len_t, block_table: Tab_t, Arrivals: Arr_t, Out: Q_t):
            kernel_of(Q, None, K, None, V, cache_seqlens, block_table, Arrivals, Out)
        return decode_paged
    if ragged:
        @T.prim_func
        def decode_ragged(Q: Q_t, K: K_t, V: K_t, cache_seqlens: Len_t, Arrivals: Arr_t, Out: Q_t):
            kernel_of(Q, None, K, None, V, cache_seqlens, None, Arrivals, Out)
        return decode_ragged

    @T.prim_func
    def decode(Q: Q_t, K: K_t, V: K_t, Arrivals: Arr_t, Out: Q_t):
        kernel_of(Q, None, K, None, V, None, None, Arrivals, Out)
    return decode


def attend_program(batch: int, heads: int, rows: int, dims: tuple, cache: tuple, page, splits: int,
                   dtype, softmax_scale: float, block_N: int, block_H: int, num_stages: int,
                   threads: int, p_shared: bool, partial_dtype, fused: bool):
    """The macro ``attend(Q, Q_pe, K, K_pe, V, lengths, table, Arrivals, Out)``: the split
    kernel and, with ``splits > 1``, the partials' workspaces and their combine: in the split
    kernel's blocks with ``fused`` (``settle_program``: the last split of a row tile merges it,
    counted in ``Arrivals``), else a second kernel (``combine_program``; ``Arrivals`` unused,
    as with one split). Q / Out are [batch, heads,
    dim] with ``rows`` consecutive query rows per KV head; scores are ``Q K^T`` (plus
    ``Q_pe K_pe^T`` with a rotary dim); V is K's tile itself when there is a rotary dim (MLA).
    ``p_shared`` stages P in shared memory (every consumer warp group reads all of it when two
    split the output's columns) rather than registers. The split kernel's partial outputs are
    ``partial_dtype`` (their log-sum-exps float32)."""
    dim, pe_dim = dims
    keys, _ = cache
    valid = min(block_H, rows)
    scale = softmax_scale * LOG2E                      # softmax in base 2
    f32 = T.float32
    blocks_of = split_range(splits, block_N, keys)
    fused = fused and splits > 1                    # one split writes the output itself
    combine = combine_program(batch, heads, dim, splits)
    settle = settle_program(heads, valid, dim, splits)

    @T.macro
    def tile(Q, Q_pe, K, K_pe, V, lengths, table, Out, LSE, hb, sid, b):
        q_tile = T.alloc_shared([block_H, dim], dtype)
        kv_tile = T.alloc_shared([block_N, dim], dtype)
        scores = T.alloc_fragment([block_H, block_N], f32)
        acc = T.alloc_fragment([block_H, dim], f32)
        row_max = T.alloc_fragment([block_H], f32)
        prev_max = T.alloc_fragment([block_H], f32)
        rescale = T.alloc_fragment([block_H], f32)
        block_sum = T.alloc_fragment([block_H], f32)
        denom = T.alloc_fragment([block_H], f32)
        if p_shared:
            p_tile = T.alloc_shared([block_H, block_N], dtype)
        else:
            p_tile = T.alloc_fragment([block_H, block_N], dtype)
        if pe_dim:
            qpe_tile = T.alloc_shared([block_H, pe_dim], dtype)
            kpe_tile = T.alloc_shared([block_N, pe_dim], dtype)
        if not pe_dim:
            v_tile = T.alloc_shared([block_N, dim], dtype)
        if not fused:
            out_tile = T.alloc_shared([valid, dim], dtype if splits == 1 else partial_dtype)
        kv_head = hb * valid // rows
        length = keys if lengths is None else lengths[b]
        first, count = blocks_of(length, sid)
        T.copy(Q[b, hb * valid:hb * valid + block_H, :], q_tile)
        if pe_dim:
            T.copy(Q_pe[b, hb * valid:hb * valid + block_H, :], qpe_tile)
        T.fill(acc, 0)
        T.fill(denom, 0)
        T.fill(row_max, -T.infinity(f32))
        for n in T.Pipelined(count, num_stages=num_stages):
            key = first * block_N + n * block_N
            if table is None:
                row, at = b, key
            else:
                row, at = table[b, key // page[1]], key % page[1]
            T.copy(K[row, at:at + block_N, kv_head, :], kv_tile)
            if pe_dim:
                T.copy(K_pe[row, at:at + block_N, kv_head, :], kpe_tile)
            T.gemm(q_tile, kv_tile, scores, transpose_B=True, clear_accum=True)  # <- read
            if pe_dim:
                T.gemm(qpe_tile, kpe_tile, scores, transpose_B=True)
            if key + block_N > length:       # keys past the sequence's end: only its last block
                for i, j in T.Parallel(block_H, block_N):
                    scores[i, j] = T.if_then_else(key + j < length, scores[i, j], -T.infinity(f32))
            T.copy(row_max, prev_max)
            T.reduce_max(scores, row_max, dim=1, clear=False)
            for i in T.Parallel(block_H):
                rescale[i] = T.exp2((prev_max[i] - row_max[i]) * scale)
            for i, j in T.Parallel(block_H, block_N):
                scores[i, j] = T.exp2((scores[i, j] - row_max[i]) * scale)
            T.reduce_sum(scores, block_sum, dim=1)
            T.copy(scores, p_tile)
            for i in T.Parallel(block_H):
                denom[i] = denom[i] * rescale[i] + block_sum[i]
            for i, j in T.Parallel(block_H, dim):
                acc[i, j] *= rescale[i]
            if pe_dim:
                T.gemm(p_tile, kv_tile, acc)
            else:
                T.copy(V[row, at:at + block_N, kv_head, :], v_tile)
                T.gemm(p_tile, v_tile, acc)
        if splits > 1:       # this split's log-sum-exp, base 2 (-inf where it had no block)
            for i in T.Parallel(block_H):
                prev_max[i] = T.log2(denom[i]) + row_max[i] * scale
        # one division per row (the largest term of a sum is 1: denom >= 1 unless the
        # split had no block, whose output is 0)
        for i in T.Parallel(block_H):
            denom[i] = 1.0 / T.max(denom[i], 1.0)
        for i, j in T.Parallel(block_H, dim):
            acc[i, j] *= denom[i]
        if fused:        # from registers: a bulk store would not be visible to the merging block
            T.copy(acc[:valid, :], Out[b, sid, hb * valid:(hb + 1) * valid, :])
        else:
            T.copy(acc[:valid, :], out_tile)
            if splits > 1:
                T.copy(out_tile, Out[b, sid, hb * valid:(hb + 1) * valid, :])
            else:
                T.copy(out_tile, Out[b, hb * valid:(hb + 1) * valid, :])
        if splits > 1:
            for i in T.Parallel(block_H):
                if i < valid:
                    LSE[b, sid, hb * valid + i] = prev_max[i]

    @T.macro
    def split_kernel(Q, Q_pe, K, K_pe, V, lengths, table, Arrivals, O_part, LSE, Out):
        if splits == 1:
            with T.Kernel(heads // valid, batch, threads=threads) as (hb, b):
                tile(Q, Q_pe, K, K_pe, V, lengths, table, Out, None, hb, 0, b)
        else:
            with T.Kernel(heads // valid, splits, batch, threads=threads) as (hb, sid, b):
                tile(Q, Q_pe, K, K_pe, V, lengths, table, O_part, LSE, hb, sid, b)
                if fused:
                    settle(O_part, LSE, Out, Arrivals, hb, b)

    @T.macro
    def attend(Q, Q_pe, K, K_pe, V, lengths, table, Arrivals, Out):
        if splits == 1:
            split_kernel(Q, Q_pe, K, K_pe, V, lengths, table, None, None, None, Out)
        else:
            O_part = T.alloc_global([batch, splits, heads, dim], partial_dtype)
            LSE = T.alloc_global([batch, splits, heads], f32)
            split_kernel(Q, Q_pe, K, K_pe, V, lengths, table, Arrivals, O_part, LSE, Out)
            if not fused:
                combine(O_part, LSE, Out)

    return attend


def decode_program(batch: int, heads: int, kv_heads: int, dim: int, cache_len: int, splits: int = 1,
                   dtype=T.float16, page: Optional[tuple] = None, ragged: bool = True, softmax_scale: Optional[float] = None, block_N: int = 128,
                   block_H: int = 64, num_stages: int = 2, threads: int = 128, fused: bool = True):
    """GQA decode: Q / Out [batch, heads, dim], the ``heads // kv_heads`` rows of KV head ``h``
    at rows ``h * group ...``; K / V [batch, cache_len, kv_heads, dim], or with ``page`` =
    (num_pages, page_size) [num_pages, page_size, kv_heads, dim] and a ``block_table`` [batch,
    cache_len // page_size]; ``ragged`` takes ``cache_seqlens`` [batch] (paged always does).
    ``Arrivals`` (before Out): zeroed counters, at least ``arrival_count(...)`` of them, where
    ``fused`` splits combine in the split kernel (``attend_program``)."""
    scale = softmax_scale if softmax_scale is not None else dim ** -0.5
    attend = attend_program(batch, heads, heads // kv_heads, (dim, 0), (cache_len, kv_heads), page,
                            splits, dtype, scale, block_N, block_H, num_stages, threads, p_shared=False,
                            partial_dtype=T.float32, fused=fused)
    return signatures(attend, batch, heads, (dim, 0), (cache_len, kv_heads), page, ragged, dtype)


def mla_decode_program(heads: int, kv_len: int, dim: int, pe_dim: int, block_H: int = 64,
                       block_N: int = 64, stages: int = 2, batch: int = 1, splits: int = 1,
                       dtype=T.float16, page: Optional[tuple] = None, ragged: bool = False, softmax_scale: Optional[float] = None,
                       fused: bool = True):
    """MLA decode: ``heads`` query heads over one latent KV head. Q / Out [batch, heads, dim],
    Q_pe [batch, heads, pe_dim]; KV [batch, kv_len, 1, dim] and K_pe [batch, kv_len, 1, pe_dim]
    (or paged as ``decode_program``'s K); scores ``Q KV^T + Q_pe K_pe^T``, values ``KV``. Two
    consumer warp groups split the [block_H, dim] accumulator by columns, so P goes through
    shared memory. Split partials are kept in ``dtype`` (as TileLang's example keeps them): a
    float32 [64, 512] output tile would not fit beside the query and the K/V ring."""
    scale = softmax_scale if softmax_scale is not None else (dim + pe_dim) ** -0.5
    attend = attend_program(batch, heads, heads, (dim, pe_dim), (kv_len, 1), page, splits, dtype,
                            scale, block_N, block_H, stages, 256, p_shared=True, partial_dtype=dtype,
                            fused=fused)
    return signatures(attend, batch, heads, (dim, pe_dim), (kv_len, 1), page, ragged, dtype)


@functools.lru_cache(maxsize=None)
def _jit(program, target: str):
    """``program`` as a kernel factory for ``target`` (each keeps its compiled kernels)."""
    return tilews.jit(out_idx=[-1], target=target)(program)

_OPERAND_DTYPES = (torch.float16, torch.bfloat16)


def blocks(dim: int, gpu: bool) -> dict:
    """The K/V block, query-row block, stages and threads of ``decode_attention``'s split kernel."""
    if not gpu:
        return dict(block_N=32, block_H=16, num_stages=2, threads=128)
    return dict(block_N=128 if dim <= 128 else 64, block_H=64, num_stages=2, threads=128)


def decode_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                     cache_seqlens: Optional[torch.Tensor] = None,
                     block_table: Optional[torch.Tensor] = None, num_splits: Optional[int] = None,
                     softmax_scale: Optional[float] = None, *, target: str = "auto") -> torch.Tensor:
    """softmax(q k^T * scale) v for each sequence's first ``cache_seqlens[b]`` cached keys:
    q [batch, seqlen_q, heads, D] (seqlen_q query tokens, each seeing the whole cache), k_cache /
    v_cache [batch, seqlen_k, kv_heads, D], or paged [num_blocks, page_size, kv_heads, D] with
    ``block_table`` [batch, max_blocks_per_seq] int32; ``cache_seqlens`` int32 [batch] (None:
    the whole cache). heads = kv_heads x group (GQA). fp16 / bf16; scale 1/sqrt(D) by default.
    Returns [batch, seqlen_q, heads, D]. Calls of a kind seen before take its kept call (module
    docstring)."""
    return _call(_decode_key, (q, k_cache, v_cache, cache_seqlens, block_table), _plan_decode,
                 (num_splits, softmax_scale, target))


def _plan_decode(tensors: tuple, num_splits, softmax_scale, target) -> tuple[torch.Tensor, Call]:
    """``decode_attention`` of checked ``tensors`` (q, the caches, lengths, table), and the call
    for arguments of their kind."""
    q, k_cache, v_cache, cache_seqlens, block_table = tensors
    paged = block_table is not None
    batch, seqlen_q, heads, dim = _check_q(q, "decode_attention", "q")
    keys, kv_heads = _check_cache(q, (k_cache, v_cache), ("k_cache", "v_cache"), dim, heads, "decode_attention")
    keys, page = _check_paging(q, k_cache, cache_seqlens, block_table, "decode_attention", keys)
    group = heads // kv_heads
    rows = seqlen_q * group
    gpu = q.device.type == "cuda"
    tiles = blocks(dim, gpu)
    if page is not None:
        tiles["block_N"] = _page_block(page[1], tiles["block_N"])
    if rows > tiles["block_H"] and rows % tiles["block_H"]:
        raise ValueError(f"decode_attention(): 'q' has {seqlen_q} query tokens x {group} heads per "
                         f"KV head = {rows} rows: at most {tiles['block_H']} or a multiple of it")
    if batch == 0 or seqlen_q == 0 or heads == 0:
        return _empty(q), _empty
    row_tiles = batch * kv_heads * math.ceil(rows / tiles["block_H"])
    splits = _splits(num_splits, row_tiles, keys, tiles["block_N"], gpu, "decode_attention")
    kernel = _jit(decode_program, target)(batch, kv_heads * rows, kv_heads, dim, keys, splits, dtypes.from_torch(q.dtype),
                    page, cache_seqlens is not None or paged, softmax_scale, **tiles,
                    fused=fuses_combine(target))
    if seqlen_q == 1:        # the packing below, as one view (q's rows already are in that order)
        def pack(q):
            return q.view(batch, heads, dim)

        def unpack(out):
            return out.view(batch, 1, heads, dim)
    else:                    # the rows of one KV head are consecutive: [batch, kv_heads, seqlen_q, group, D]
        def pack(q):
            return q.view(batch, seqlen_q, kv_heads, group, dim).transpose(1, 2).reshape(batch, kv_heads * rows, dim)

        def unpack(out):
            return out.view(batch, kv_heads, seqlen_q, group, dim).transpose(1, 2).reshape(batch, seqlen_q, heads, dim)
    fused = fuses_combine(target) and splits > 1
    tail = _tail(cache_seqlens, block_table, batch, keys, page, q.device, row_tiles, fused, "decode_attention")
    as_k, as_v = _contiguous_of(k_cache), _contiguous_of(v_cache)
    return _bound(kernel, lambda q, k, v, lengths, table: (pack(q), as_k(k), as_v(v), *tail(lengths, table)),
                  unpack, tensors)


def mla_decode(q_nope: torch.Tensor, q_pe: torch.Tensor, kv_cache: torch.Tensor,
               k_pe_cache: torch.Tensor, cache_seqlens: Optional[torch.Tensor] = None,
               block_table: Optional[torch.Tensor] = None, num_splits: Optional[int] = None,
               softmax_scale: Optional[float] = None, *, target: str = "auto") -> torch.Tensor:
    """DeepSeek MLA decode: q_nope [batch, heads, dim] and q_pe [batch, heads, pe_dim] against
    one latent head, kv_cache [batch, seqlen_k, 1, dim] (both K and V) and k_pe_cache [batch,
    seqlen_k, 1, pe_dim] (or paged [num_blocks, page_size, 1, ...] with ``block_table``);
    scores (q_nope kv^T + q_pe k_pe^T) * scale, scale 1/sqrt(dim + pe_dim) by default. heads a
    multiple of 64. Returns [batch, heads, dim]. Calls of a kind seen before take its kept call
    (module docstring)."""
    return _call(_mla_key, (q_nope, q_pe, kv_cache, k_pe_cache, cache_seqlens, block_table), _plan_mla,
                 (num_splits, softmax_scale, target))


def _plan_mla(tensors: tuple, num_splits, softmax_scale, target) -> tuple[torch.Tensor, Call]:
    """``mla_decode`` of checked ``tensors`` (the queries, the caches, lengths, table), and the
    call for arguments of their kind."""
    q_nope, q_pe, kv_cache, k_pe_cache, cache_seqlens, block_table = tensors
    name = "mla_decode"
    paged = block_table is not None
    for arg, t, want in (("q_nope", q_nope, 3), ("q_pe", q_pe, 3), ("kv_cache", kv_cache, 4),
                         ("k_pe_cache", k_pe_cache, 4)):
        _tensor(q_nope, t, arg, want, name)
    batch, heads, dim = q_nope.shape
    pe_dim = q_pe.shape[2]
    if tuple(q_pe.shape[:2]) != (batch, heads):
        raise ValueError(f"{name}(): 'q_pe' has shape {tuple(q_pe.shape)}; want [{batch}, {heads}, pe_dim]")
    if heads % 64:
        raise ValueError(f"{name}(): 'q_nope' has {heads} heads; want a multiple of 64")
    if kv_cache.shape[2] != 1 or kv_cache.shape[3] != dim:
        raise ValueError(f"{name}(): 'kv_cache' has shape {tuple(kv_cache.shape)}; want "
                         f"[..., ..., 1, {dim}] (one latent head of q_nope's dim)")
    if tuple(k_pe_cache.shape) != (*kv_cache.shape[:3], pe_dim):
        raise ValueError(f"{name}(): 'k_pe_cache' has shape {tuple(k_pe_cache.shape)}; want "
                         f"{(*kv_cache.shape[:3], pe_dim)}")
    keys, page = _check_paging(q_nope, kv_cache, cache_seqlens, block_table, name, kv_cache.shape[1])
    block_N = 64 if page is None else _page_block(page[1], 64)
    if batch == 0:
        return _empty(q_nope), _empty
    row_tiles = batch * heads // 64
    splits = _splits(num_splits, row_tiles, keys, block_N, q_nope.device.type == "cuda", name)
    kernel = _jit(mla_decode_program, target)(heads, keys, dim, pe_dim, 64, block_N, 2, batch, splits,
                                              dtypes.from_torch(q_nope.dtype), page,
                                              cache_seqlens is not None or paged, softmax_scale,
                                              fuses_combine(target))
    tail = _tail(cache_seqlens, block_table, batch, keys, page, q_nope.device, row_tiles,
                 fuses_combine(target) and splits > 1, name)
    as_q, as_q_pe, as_kv, as_k_pe = map(_contiguous_of, (q_nope, q_pe, kv_cache, k_pe_cache))
    return _bound(kernel, lambda q, q_pe, kv, k_pe, lengths, table: (
        as_q(q), as_q_pe(q_pe), as_kv(kv), as_k_pe(k_pe), *tail(lengths, table)), _same, tensors)


# --- calling ---------------------------------------------------------------------------------------
Call = Callable[..., torch.Tensor]
# the ops' one lookup: (the op's key function, each tensor argument's shape, strides, dtype and
# device (None where an optional one is not given), num_splits, softmax_scale and target each
# with its type) -> the call for that kind of arguments; only checked kinds are stored
_calls: dict[tuple, Call] = {}


def _kind(t: Optional[torch.Tensor]) -> Optional[tuple]:
    """An optional tensor argument's part of a call's key (None where not given)."""
    return None if t is None else (t.shape, t.stride(), t.dtype, t.device)


def _decode_key(q, k, v, lengths, table, num_splits, softmax_scale, target) -> tuple:
    """``decode_attention``'s key, flat (spelled out: no loop or tuple per argument)."""
    return (_decode_key, q.shape, q.stride(), q.dtype, q.device, k.shape, k.stride(), k.dtype, k.device,
            v.shape, v.stride(), v.dtype, v.device, _kind(lengths), _kind(table), type(num_splits),
            num_splits, type(softmax_scale), softmax_scale, type(target), target)


def _mla_key(q, q_pe, kv, k_pe, lengths, table, num_splits, softmax_scale, target) -> tuple:
    """``mla_decode``'s key, as ``_decode_key``."""
    return (_mla_key, q.shape, q.stride(), q.dtype, q.device, q_pe.shape, q_pe.stride(), q_pe.dtype,
            q_pe.device, kv.shape, kv.stride(), kv.dtype, kv.device, k_pe.shape, k_pe.stride(),
            k_pe.dtype, k_pe.device, _kind(lengths), _kind(table), type(num_splits), num_splits,
            type(softmax_scale), softmax_scale, type(target), target)


def _call(key_of: Callable, tensors: tuple, plan: Callable, options: tuple) -> torch.Tensor:
    """The result of an op on ``tensors``: by the call kept for their kind (``key_of(*tensors,
    *options)``; each option with its type, so that ``num_splits=True`` is not the kind of 1),
    else by ``plan(tensors, *options)`` (the checks, the first call, and its call, kept for the
    kind; arguments that are not tensors, or an option with no hash: never kept)."""
    try:
        key = key_of(*tensors, *options)
        call = _calls[key]
    except KeyError:
        result, call = plan(tensors, *options)
        remember(_calls, key, call)
        return result
    except (AttributeError, TypeError):   # not tensors (the checks name the argument), no hash
        return plan(tensors, *options)[0]
    return call(*tensors)


def _same(out: torch.Tensor) -> torch.Tensor:
    return out


def _empty(q, *rest) -> torch.Tensor:
    """The call of an empty query: an empty result."""
    return torch.empty_like(q)


def _bound(kernel, arguments: Callable, finish: Callable, tensors: tuple) -> tuple[torch.Tensor, Call]:
    """The result of the op's ``tensors`` (its tensor arguments, None where not given) and the
    call for their kind: ``arguments(*tensors)`` are the kernel's inputs, ``finish`` makes the
    op's result of the kernel's output; the kernel's binding fixed to these inputs' signature
    (``Kernel.bound``: the key of the op's call proves a later call's)."""
    args = arguments(*tensors)
    run = kernel.bound(args)

    def call(*tensors):
        return finish(run(*arguments(*tensors)))
    return finish(run(*args)), call


def _tensor(first, t, arg: str, dims: int, op: str) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{op}(): '{arg}' must be a torch.Tensor, got {type(t).__name__}")
    if t.dim() != dims:
        raise ValueError(f"{op}(): '{arg}' must be {dims}-d, got shape {tuple(t.shape)}")
    if t.dtype not in _OPERAND_DTYPES:
        raise TypeError(f"{op}(): '{arg}' must be float16 or bfloat16, got {t.dtype}")
    if t.dtype != first.dtype:
        raise TypeError(f"{op}(): '{arg}' is {t.dtype} but the query is {first.dtype}; they must match")
    if t.device != first.device:
        raise ValueError(f"{op}(): '{arg}' is on {t.device} but the query is on {first.device}")


def _check_q(q, op: str, arg: str) -> tuple:
    _tensor(q, q, arg, 4, op)
    return tuple(q.shape)


def _check_cache(q, caches, names, dim, heads, op) -> tuple:
    """(keys per page or sequence, kv_heads) of K / V caches of the same shape."""
    for name, t in zip(names, caches):
        _tensor(q, t, name, 4, op)
        if t.shape != caches[0].shape:
            raise ValueError(f"{op}(): '{name}' has shape {tuple(t.shape)} but '{names[0]}' has "
                             f"{tuple(caches[0].shape)}; they must match")
    _, keys, kv_heads, d = caches[0].shape
    if d != dim:
        raise ValueError(f"{op}(): '{names[0]}' has head dim {d} but 'q' has {dim}")
    if kv_heads == 0 or heads % kv_heads:
        raise ValueError(f"{op}(): 'q' has {heads} heads, not a multiple of '{names[0]}''s "
                         f"{kv_heads} KV heads")
    return keys, kv_heads


def _check_paging(q, cache, cache_seqlens, block_table, op: str, keys: int) -> tuple:
    """(keys per sequence, page) where page is None (dense) or (num_blocks, page_size)."""
    batch = q.shape[0]
    if cache_seqlens is not None:
        if not isinstance(cache_seqlens, torch.Tensor) or cache_seqlens.dtype != torch.int32 \
                or tuple(cache_seqlens.shape) != (batch,):
            raise ValueError(f"{op}(): 'cache_seqlens' must be an int32 tensor of shape ({batch},)")
        if cache_seqlens.device != q.device:
            raise ValueError(f"{op}(): 'cache_seqlens' is on {cache_seqlens.device} but the query on {q.device}")
    if block_table is None:
        if cache.shape[0] != batch:
            raise ValueError(f"{op}(): the cache holds {cache.shape[0]} sequences but the query {batch} "
                             f"(a paged cache needs 'block_table')")
        return keys, None
    if not isinstance(block_table, torch.Tensor) or block_table.dtype != torch.int32 \
            or block_table.dim() != 2 or block_table.shape[0] != batch:
        raise ValueError(f"{op}(): 'block_table' must be an int32 tensor of shape ({batch}, "
                         f"max_blocks_per_seq)")
    if block_table.device != q.device:
        raise ValueError(f"{op}(): 'block_table' is on {block_table.device} but the query on {q.device}")
    if keys % 16:
        raise ValueError(f"{op}(): the cache's page size {keys} (its dim 1 with 'block_table') "
                         f"must be a multiple of 16")
    return block_table.shape[1] * keys, (cache.shape[0], keys)


def _page_block(page_size: int, block_N: int) -> int:
    """The largest K/V block up to ``block_N`` that divides the page (the page is a multiple of 16)."""
    while page_size % block_N:
        block_N //= 2
    return block_N


def fuses_combine(target: str) -> bool:
    """Whether the ops' split kernels combine their splits themselves (``settle_program``): on
    every target but Metal, whose atomics return nothing (there the combine is a second
    kernel)."""
    return targets.resolve(target)[0] != "metal"


def _splits(num_splits, tiles: int, keys: int, block_N: int, gpu: bool, op: str) -> int:
    if num_splits is None:
        return choose_num_splits(tiles, keys, block_N, targets.num_sms()) if gpu else 1
    if not isinstance(num_splits, int) or isinstance(num_splits, bool) or num_splits < 1:
        raise ValueError(f"{op}(): 'num_splits' must be a positive int, got {num_splits!r}")
    return num_splits


def _tail(cache_seqlens, block_table, batch: int, keys: int, page, device, row_tiles: int,
          counted: bool, op: str) -> Callable:
    """The kernel's last inputs of a call, ``tail(cache_seqlens, block_table)``: the lengths (the
    given ones; for a paged cache without them, the whole cache's: the paged program always reads
    lengths), then the block table where paged, then arrival counters, at least ``row_tiles``.
    Where the kernel counts its splits (``counted``: a fused combine of several splits), they
    are the current stream's (``arrivals.arrival_counters``: zero at launch; the kernel leaves
    them so), found per call, not kept: made while a CUDA graph is captured they hold nothing
    until it is replayed (the capture's stream has its own counters), and kept from before they
    could be freed (the kept calls starting over) while a graph still reads them. Where it does
    not (one split, or the combine a second kernel), the kernel never reads them: this stream's
    counters now, kept. The whole cache's lengths are made per call, as counted counters are found.
    Lengths and tables of a contiguous kind are passed as they are (the call's key fixes their
    strides). On the CPU each call's lengths (at most ``keys``) and pages (below the cache's)
    are checked, as ``attention_varlen`` checks its offsets there; on a GPU they are trusted
    (reading them back would stall the stream)."""
    contiguous_lengths, contiguous_table = _contiguous_of(cache_seqlens), _contiguous_of(block_table)

    def checked_lengths(lengths):
        _within(lengths, keys, op, "cache_seqlens", f"the cache's {keys} keys per sequence")
        return contiguous_lengths(lengths)

    def checked_table(table):
        _within(table, page[0] - 1, op, "block_table", f"the last of the cache's {page[0]} pages")
        return contiguous_table(table)
    on_cpu = device.type == "cpu"
    as_lengths = checked_lengths if on_cpu else contiguous_lengths
    as_table = checked_table if on_cpu else contiguous_table
    if counted:
        def counters():
            return arrival_counters(device, row_tiles)
    else:
        unread = arrival_counters(device, row_tiles)

        def counters():
            return unread
    if block_table is None:
        if cache_seqlens is None:
            return lambda lengths, table: (counters(),)
        return lambda lengths, table: (as_lengths(lengths), counters())
    if cache_seqlens is None:
        return lambda lengths, table: (torch.full((batch,), keys, dtype=torch.int32, device=device),
                                       as_table(table), counters())
    return lambda lengths, table: (as_lengths(lengths), as_table(table), counters())


def _contiguous_of(t: Optional[torch.Tensor]) -> Callable:
    """What makes a tensor of ``t``'s kind (its strides fixed by a kept call's key) contiguous:
    nothing where ``t`` is (or is absent), else ``.contiguous()``."""
    return _same if t is None or t.is_contiguous() else torch.Tensor.contiguous


def _within(t: torch.Tensor, most: int, op: str, arg: str, what: str) -> None:
    """A ValueError naming ``arg`` unless every value of ``t`` is in [0, most]."""
    if not t.numel():
        return
    low, high = (int(x) for x in torch.aminmax(t))
    if low < 0 or high > most:
        raise ValueError(f"{op}(): '{arg}' holds values from {low} to {high}; each must be from 0 "
                         f"to {most} ({what})")
