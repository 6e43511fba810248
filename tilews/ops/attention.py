"""Attention forward (FlashAttention's online softmax) as a ready-made op, written in the tile
language as TileLang's own example is (``examples/flash_attention/example_mha_fwd_bhsd.py`` /
``_bshd.py``): the Q tile in shared memory, a ``T.Pipelined`` loop over K/V blocks that keeps the
row maximum and sum and rescales the running output.

On Hopper the compiler splits the program into a TMA producer (Q once, then K and V rings) and
one consumer role per warp group; S = Q K^T, the softmax and P (S cast to 16 bits) stay in
registers, P V reads P as the wgmma's register operand, and P V of one block runs while the
softmax of the next is computed. Causal or not, BHSD or BSHD tensors, any
sequence length (keys past the end are masked, rows past the end are not stored).

``attention(q, k, v, is_causal=False, layout="bhsd")`` checks its arguments (the parameter named
in each error; head dims are multiples of 8 from 16 to 256: ``HEAD_DIMS``), returns an empty result for a zero-length sequence, and picks blocks for the
device: 128 x 128 blocks, two consumer warp groups and a 2-deep K/V ring on a GPU (at head dims
above 128, 64-row K/V blocks in one stage: more would exceed shared memory), 64 x 64 on the
CPU's interpreter.
"""
from __future__ import annotations

import math

import torch

import tilews
import tilews.language as T
from tilews.lowering import dtypes

LOG2E = 1.4426950408889634


def _dims(batch, heads, seq_len, dim, layout):
    if layout not in ("bhsd", "bshd"):
        raise ValueError(f"layout must be 'bhsd' or 'bshd', got {layout!r}")
    return [batch, heads, seq_len, dim] if layout == "bhsd" else [batch, seq_len, heads, dim]


def mha_fwd_program(batch, heads, seq_len, dim, is_causal, block_M=128, block_N=128, num_stages=2,
                    threads=256, layout="bhsd", dtype=T.float16, kv_heads=None, store_lse=False):
    """The forward program: ``Output = softmax(Q K^T / sqrt(dim)) V``. ``kv_heads`` (default
    ``heads``): K and V have that many heads, each serving ``heads // kv_heads`` consecutive query
    heads (GQA). ``store_lse``: a fifth parameter ``LSE`` [batch, heads, lse_rows(seq_len,
    block_M)] float32 receives each row's log-sum-exp of the scaled scores in base 2
    (``log2(sum) + max * scale``, what the backward reads), rows past the end included (finite:
    their Q rows are zeros)."""
    kv_heads = heads if kv_heads is None else kv_heads
    shape = _dims(batch, heads, seq_len, dim, layout)
    kv_shape = _dims(batch, kv_heads, seq_len, dim, layout)
    attend = attention_block(dim, heads // kv_heads, is_causal, block_M, block_N, num_stages,
                             layout, dtype)

    @T.macro
    def grid(Q, K, V, Output, LSE):
        # causal: the compiler starts the longest rows (the last query blocks) first where the
        # grid is launched as it stands (longest_first); a persistent kernel deals them evenly
        with T.Kernel(T.ceildiv(seq_len, block_M), heads, batch, threads=threads) as (bx, by, bz):
            attend(Q, K, V, Output, LSE, bx, by, bz, 0, seq_len, 0, seq_len)

    if store_lse:
        @T.prim_func
        def main(Q: T.Tensor(shape, dtype), K: T.Tensor(kv_shape, dtype), V: T.Tensor(kv_shape, dtype),
                 Output: T.Tensor(shape, dtype),
                 LSE: T.Tensor([batch, heads, lse_rows(seq_len, block_M)], T.float32)):
            grid(Q, K, V, Output, LSE)
    else:
        @T.prim_func
        def main(Q: T.Tensor(shape, dtype), K: T.Tensor(kv_shape, dtype), V: T.Tensor(kv_shape, dtype),
                 Output: T.Tensor(shape, dtype)):
            grid(Q, K, V, Output, None)
    return main


def attention_block(dim, group, is_causal, block_M, block_N, num_stages, layout, dtype,
                    sm_scale=None):
    """The macro computing one query block of one head: ``attend(Q, K, V, Output, LSE, bx, by,
    bz, q_start, q_len, k_start, k_len)`` writes rows ``[bx * block_M, (bx + 1) * block_M)`` of
    query head ``by`` of sequence ``bz``, whose queries are rows ``q_start + [0, q_len)`` and keys
    rows ``k_start + [0, k_len)`` of their tensors (``layout`` "bhsd" / "bshd": the batch index
    ``bz``, starts 0, lengths the compile-time sequence length; ``"varlen"``: packed [rows, heads,
    dim] tensors, starts and lengths read from ``cu_seqlens``). Causal keys are aligned to the
    bottom right: query ``i`` sees keys ``j <= i + k_len - q_len`` (0 when the lengths are equal).

    ``"varlen"`` stores only the block's rows below ``q_len`` (the rows past it belong to the next
    sequence): a block wholly inside its sequence through shared memory in one bulk copy, as the
    dense layouts do, the sequence's last block by element from that staged tile (from registers
    above D 128, where there is none); a block past the
    end, ``bx * block_M >= q_len``, loads its Q tile from past the tensor's last row (the
    warp-specialized producer's preload is unconditional; zeros, no memory read) but no K/V
    block, and skips the epilogue: no output or LSE row. A query
    that sees no key (causal with ``q_len > k_len``, or ``k_len == 0``) gets a zero output and a log-sum-exp of +inf (FlashAttention's convention: its backward
    weights are zero). ``LSE`` is None or [batch, heads, whole query blocks] as in
    ``mha_fwd_program``. ``sm_scale``: the scores' scale (default ``1 / sqrt(dim)``)."""
    # softmax in base 2
    scale = LOG2E / math.sqrt(dim) if sm_scale is None else LOG2E * sm_scale
    accum = T.float32
    varlen = layout == "varlen"
    rows = tile_rows(layout)

    @T.macro
    def attend(Q, K, V, Output, LSE, bx, by, bz, q_start, q_len, k_start, k_len):
        offset = k_len - q_len                     # causal: query i sees keys j <= i + offset
        Q_shared = T.alloc_shared([block_M, dim], dtype)
        K_shared = T.alloc_shared([block_N, dim], dtype)
        V_shared = T.alloc_shared([block_N, dim], dtype)
        # above D128 the output goes straight to global memory and the compiler stages it where
        # shared memory holds it beside a 2-slot K/V ring (D192), else stores from registers (D256)
        O_shared = None if dim > 128 else T.alloc_shared([block_M, dim], dtype)
        acc_s = T.alloc_fragment([block_M, block_N], accum)
        acc_s_cast = T.alloc_fragment([block_M, block_N], dtype)
        acc_o = T.alloc_fragment([block_M, dim], accum)
        scores_max = T.alloc_fragment([block_M], accum)
        scores_max_prev = T.alloc_fragment([block_M], accum)
        scores_scale = T.alloc_fragment([block_M], accum)
        scores_sum = T.alloc_fragment([block_M], accum)
        logsum = T.alloc_fragment([block_M], accum)

        if varlen:
            # a block past its sequence's end loads its Q tile from past the tensor's last row
            # (the warp-specialized producer's preload is unconditional): the tensor copy unit
            # fills it with zeros without reading memory
            q_row = T.if_then_else(bx * block_M < q_len, q_start + bx * block_M, Q.shape[0])
        else:
            q_row = q_start + bx * block_M
        T.copy(rows(Q, bz, by, q_row, block_M), Q_shared)
        T.fill(acc_o, 0)
        T.fill(logsum, 0)
        T.fill(scores_max, -T.infinity(accum))
        if is_causal:
            loop_range = T.min(T.ceildiv(k_len, block_N), T.ceildiv((bx + 1) * block_M + offset, block_N))
        else:
            loop_range = T.ceildiv(k_len, block_N)
        if varlen:
            # no K/V block for a block past its sequence's end (the warp-specialized pipeline
            # needs its loop at the kernel's top level: no early return around it)
            loop_range = T.if_then_else(bx * block_M < q_len, loop_range, 0)
        for k in T.Pipelined(loop_range, num_stages=num_stages):
            kb = key_block(k, loop_range)
            T.copy(rows(K, bz, by // group, k_start + kb * block_N, block_N), K_shared)
            # -inf where a key is past the end (or, causal, after the query). Causal: S
            # starts as 0 / -inf and Q K^T accumulates into it (TileLang's form: the mask is
            # ready before the gemm is issued); a row below q_len sees keys up to its own
            # position + offset < k_len, so the causal condition alone masks the keys past the
            # end for every row that is stored. On Hopper the compiler applies the mask after
            # a gemm that overwrites S (mask_after_gemm) and runs the blocks below the diagonal
            # unmasked (uniform_selects). (H200, B4 H32 S4096 D128: an explicit branch with a T.clear and
            # the key bound in the mask spilled 48 bytes, 0.93x cuDNN; this form 0 bytes.)
            # Otherwise the mask is rare (a ragged end), so S = Q K^T is written whole and
            # masked after, with no branch before the gemm.
            if is_causal:
                for i, j in T.Parallel(block_M, block_N):
                    acc_s[i, j] = T.if_then_else(bx * block_M + i + offset >= k * block_N + j, 0,
                                                 -T.infinity(accum))
                T.gemm(Q_shared, K_shared, acc_s, transpose_B=True)
            else:
                T.gemm(Q_shared, K_shared, acc_s, transpose_B=True, clear_accum=True)
                if ragged_end(k, kb, k_len):
                    for i, j in T.Parallel(block_M, block_N):
                        acc_s[i, j] = T.if_then_else(kb * block_N + j < k_len, acc_s[i, j],
                                                     -T.infinity(accum))
            T.copy(rows(V, bz, by // group, k_start + kb * block_N, block_N), V_shared)
            T.copy(scores_max, scores_max_prev)
            T.fill(scores_max, -T.infinity(accum))
            T.reduce_max(acc_s, scores_max, dim=1, clear=False)
            for i in T.Parallel(block_M):
                scores_max[i] = T.max(scores_max[i], scores_max_prev[i])
            for i in T.Parallel(block_M):
                scores_scale[i] = T.exp2(scores_max_prev[i] * scale - scores_max[i] * scale)
            for i, j in T.Parallel(block_M, block_N):
                acc_s[i, j] = T.exp2(acc_s[i, j] * scale - scores_max[i] * scale)
            T.reduce_sum(acc_s, scores_sum, dim=1)
            for i in T.Parallel(block_M):
                logsum[i] = logsum[i] * scores_scale[i] + scores_sum[i]
            T.copy(acc_s, acc_s_cast)
            for i, j in T.Parallel(block_M, dim):
                acc_o[i, j] *= scores_scale[i]
            T.gemm(acc_s_cast, V_shared, acc_o)
        # a varlen block past its sequence's end has no row to finish (its loop ran no
        # iteration): it skips the epilogue; other blocks finish (a Python True: no branch)
        live = bx * block_M < q_len if varlen else True
        if live:
            # one division per row, then a multiply per element: an IEEE division per element
            # (div.rn) costs as much as a block's softmax, in an epilogue no gemm hides
            for i in T.Parallel(block_M):
                logsum[i] = 1.0 / logsum[i]
            if varlen:
                # a row that saw no key holds NaN (its maximum stayed -inf): its output is zero
                for i, j in T.Parallel(block_M, dim):
                    acc_o[i, j] = T.if_then_else(sees_a_key(bx * block_M + i, offset, k_len),
                                                 acc_o[i, j] * logsum[i], 0)
            else:
                for i, j in T.Parallel(block_M, dim):
                    acc_o[i, j] *= logsum[i]
            # the sequence's last block stores its rows below q_len only (the rows past them
            # are the next sequence's, which a bulk store of the whole block would write)
            partial = varlen and (bx + 1) * block_M > q_len
            if O_shared is None:
                if partial:
                    for i, j in T.Parallel(block_M, dim):
                        if bx * block_M + i < q_len:
                            Output[q_start + bx * block_M + i, by, j] = T.cast(acc_o[i, j], dtype)
                else:
                    T.copy(acc_o, rows(Output, bz, by, q_start + bx * block_M, block_M))
            else:
                T.copy(acc_o, O_shared)
                if partial:
                    # read back from the staged tile (as TileLang's varlen example does): 16-byte
                    # runs of rows, where the accumulator's layout stored 2 or 4 bytes at a time
                    # (ptxas spilled 88-92 bytes for their addresses at D 128; now 8). The row
                    # is q_start + (the mask's row): written q_start + bx * block_M + i, ptxas
                    # gave the non-causal K/V loop 29-31 moves of P's registers before each P V
                    # wgmma (sm_90a, D 128, no LSE: 488 instructions a loop; this form 459)
                    for i, j in T.Parallel(block_M, dim):
                        if bx * block_M + i < q_len:
                            Output[q_start + (bx * block_M + i), by, j] = O_shared[i, j]
                else:
                    T.copy(O_shared, rows(Output, bz, by, q_start + bx * block_M, block_M))
            if LSE is not None:
                # log2(sum) + max * scale: logsum holds 1 / sum here
                if varlen:
                    # by element: the LSE's rows (lse_rows) are a runtime size, which leaves its
                    # pitch to a bulk copy unknown
                    for i in T.Parallel(block_M):
                        LSE[bz, by, bx * block_M + i] = T.if_then_else(
                            sees_a_key(bx * block_M + i, offset, k_len),
                            scores_max[i] * scale - T.log2(logsum[i]), T.infinity(accum))
                else:
                    for i in T.Parallel(block_M):
                        logsum[i] = scores_max[i] * scale - T.log2(logsum[i])
                    T.copy(logsum, LSE[bz, by, bx * block_M])

    # Non-causal varlen: the K/V blocks in the order last, 0, 1, ..., so the ragged end's mask
    # is the first iteration's, which the warp-specialized consumer runs before its loop: the
    # loop's copy keeps a test of `k + 1 == 0` that Triton folds away, and the loop has no
    # branch (a branch on the runtime length in it kept ptxas from issuing the row maximum
    # under the P V wgmma, as it does in the dense kernel, where a compile-time length folds it).
    # Causal keeps the ascending order: its diagonal blocks are the last ones.
    @T.macro
    def key_block(k, blocks):
        if varlen and not is_causal:
            return T.if_then_else(k == 0, blocks - 1, k - 1)
        else:
            return k

    @T.macro
    def ragged_end(k, kb, k_len):
        if varlen and not is_causal:
            return k == 0
        else:
            return (kb + 1) * block_N > k_len

    @T.macro
    def sees_a_key(row, offset, k_len):
        if is_causal:
            return row + offset >= 0
        else:
            return k_len > 0

    return attend


def tile_rows(layout: str):
    """The macro ``rows(X, b, h, row, n)``: the ``n`` rows of head ``h`` of sequence ``b`` from
    row ``row`` of ``X`` in ``layout`` ("bhsd", "bshd", or "varlen": ``X`` [rows, heads, dim],
    ``row`` counted from the tensor's first row, ``b`` unused)."""
    @T.macro
    def rows(X, b, h, row, n):
        if layout == "bhsd":
            return X[b, h, row, 0]
        elif layout == "bshd":
            return X[b, row:row + n, h, :]
        else:
            return X[row:row + n, h, :]
    return rows


def mha_fwd_varlen_program(heads, kv_heads, dim, is_causal, block_M=128, block_N=128, num_stages=2,
                           threads=256, dtype=T.float16, store_lse=False, sm_scale=None):
    """The forward over packed sequences (FlashAttention's ``varlen`` form): Q and Output
    [total_q, heads, dim], K and V [total_k, kv_heads, dim], sequence ``b`` the rows
    ``cu_seqlens_q[b]:cu_seqlens_q[b + 1]`` of Q (and ``cu_seqlens_k`` of K, V), int32. The
    batch, the totals and ``max_seqlen_q`` (the runtime scalar that sizes the grid: one block per
    ``block_M`` rows of the longest sequence) are not compiled in. A block past its sequence's
    end computes and stores nothing. On Hopper the grid becomes persistent (``persist``: one
    block per SM over the tiles in alternating rounds, the next tile's loads under this one's
    epilogue), as the dense forward's does. ``store_lse``: ``LSE`` [batch, heads, lse_rows] float32 as in
    ``mha_fwd_program``, each sequence's rows from 0 (whole query blocks; ``lse_rows`` at least
    ``lse_rows(max_seqlen_q, block_M)``). ``sm_scale``: as ``attention_block``'s."""
    seqs, batch, total_q, total_k, padded = varlen_dims()
    shape, kv_shape = [total_q, heads, dim], [total_k, kv_heads, dim]
    attend = attention_block(dim, heads // kv_heads, is_causal, block_M, block_N, num_stages,
                             "varlen", dtype, sm_scale)

    @T.macro
    def grid(Q, K, V, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, Output, LSE):
        with T.Kernel(T.ceildiv(max_seqlen_q, block_M), heads, T.dynamic("batch_plus_1") - 1,
                      threads=threads) as (bm, by, bz):
            q_start = cu_seqlens_q[bz]
            q_len = cu_seqlens_q[bz + 1] - q_start
            k_start = cu_seqlens_k[bz]
            k_len = cu_seqlens_k[bz + 1] - k_start
            # causal: the sequence's last query blocks first (as in mha_fwd_program); a block
            # past the sequence's end keeps its index (and does nothing: attention_block)
            if is_causal:
                bx = T.if_then_else(bm * block_M < q_len, T.ceildiv(q_len, block_M) - 1 - bm, bm)
            else:
                bx = bm
            attend(Q, K, V, Output, LSE, bx, by, bz, q_start, q_len, k_start, k_len)

    if store_lse:
        @T.prim_func
        def main(Q: T.Tensor(shape, dtype), K: T.Tensor(kv_shape, dtype), V: T.Tensor(kv_shape, dtype),
                 cu_seqlens_q: T.Tensor([seqs], T.int32), cu_seqlens_k: T.Tensor([seqs], T.int32),
                 max_seqlen_q: T.int32, Output: T.Tensor(shape, dtype),
                 LSE: T.Tensor([batch, heads, padded], T.float32)):
            grid(Q, K, V, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, Output, LSE)
    else:
        @T.prim_func
        def main(Q: T.Tensor(shape, dtype), K: T.Tensor(kv_shape, dtype), V: T.Tensor(kv_shape, dtype),
                 cu_seqlens_q: T.Tensor([seqs], T.int32), cu_seqlens_k: T.Tensor([seqs], T.int32),
                 max_seqlen_q: T.int32, Output: T.Tensor(shape, dtype)):
            grid(Q, K, V, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, Output, None)
    return main


def varlen_dims() -> tuple:
    """The runtime dimensions the varlen programs (forward and backward) share: the entries of
    ``cu_seqlens`` (batch + 1), the batch (the LSE's first dim: the op checks it is the same
    number), the packed rows of Q and of K / V, and the LSE's rows per head — declarations for
    the parameters' shapes (a kernel body reads one by its name, ``T.dynamic(name)``)."""
    return tuple(map(T.dynamic, ("batch_plus_1", "batch", "total_q", "total_k", "lse_rows")))


def lse_rows(seq_len: int, block_M: int) -> int:
    """The rows of the forward's log-sum-exp (and the backward's row vectors): whole query blocks."""
    return -(-seq_len // block_M) * block_M


mha_fwd = tilews.jit(out_idx=[3])(mha_fwd_program)


@tilews.jit(out_idx=[3, 4])
def mha_fwd_lse(*args, **kwargs):
    """``mha_fwd_program`` storing the log-sum-exp (what the backward reads)."""
    return mha_fwd_program(*args, **kwargs, store_lse=True)


_OPERAND_DTYPES = (torch.float16, torch.bfloat16)
# the head dims every target takes: Q K^T reduces over the head dim, which Triton's tl.dot needs
# at least 16 long for 16-bit operands on a GPU (wgmma's k step is 16 too: other multiples of 8 run
# on the triton fallback, padded); above 256 the tiles outgrow a Hopper SM's shared memory
HEAD_DIMS = (16, 256)


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, is_causal: bool = False,
              layout: str = "bhsd") -> torch.Tensor:
    """softmax(q k^T / sqrt(D)) v for 4-d fp16/bf16 tensors, q [batch, heads, seq, D]
    (``layout="bhsd"``) or [batch, seq, heads, D] (``"bshd"``), k and v the same with
    ``kv_heads`` heads dividing ``heads`` (GQA: query head h reads KV head h // (heads //
    kv_heads)); causal masks keys after the query's position. Differentiable: where an operand
    requires grad (and grad mode is on), the op records its backward (``attention_backward``)."""
    _check(q, k, v, layout)
    if torch.compiler.is_compiling() or (torch.is_grad_enabled() and
                                         (q.requires_grad or k.requires_grad or v.requires_grad)):
        return torch.ops.tilews.attention(q, k, v, bool(is_causal), layout)[0]
    return _forward(q, k, v, bool(is_causal), layout, store_lse=False)[0]


def _forward(q, k, v, is_causal: bool, layout: str, store_lse: bool):
    """(output, the base-2 log-sum-exp [batch, heads, rows] or None)."""
    batch, heads, seq_len, dim, kv_heads = operand_sizes(q, k, layout)
    if seq_len == 0 or batch == 0 or heads == 0:
        lse = q.new_zeros((batch, heads, 0), dtype=torch.float32) if store_lse else None
        return torch.empty_like(q), lse
    factory = mha_fwd_lse if store_lse else mha_fwd
    kernel = factory(batch, heads, seq_len, dim, is_causal, layout=layout, kv_heads=kv_heads,
                     dtype=dtypes.from_torch(q.dtype), **blocks(dim, gpu=q.device.type == "cuda"))
    result = kernel(q, k, v)
    return result if store_lse else (result, None)


def operand_sizes(q, k, layout: str) -> tuple:
    """(batch, heads, seq_len, dim, kv_heads) of checked operands."""
    if layout == "bhsd":
        return (*q.shape, k.shape[1])
    return q.shape[0], q.shape[2], q.shape[1], q.shape[3], k.shape[2]


def blocks(dim: int, gpu: bool) -> dict:
    """The block sizes, threads and K/V stages ``attention`` uses for head dim ``dim``."""
    if not gpu:
        return dict(block_M=64, block_N=64, threads=128, num_stages=2)
    if dim > 128:        # Q, O and one 64-row K/V stage: 192 KB of the 227 KB
        return dict(block_M=128, block_N=64, threads=256, num_stages=1)
    return dict(block_M=128, block_N=128, threads=256, num_stages=2)


def _check(q, k, v, layout) -> tuple:
    if layout not in ("bhsd", "bshd"):
        raise ValueError(f"attention(layout=...) must be 'bhsd' or 'bshd', got {layout!r}")
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"attention(): '{name}' must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() != 4:
            raise ValueError(f"attention(): '{name}' must be 4-d ({layout}), got shape {tuple(t.shape)}")
        if t.dtype not in _OPERAND_DTYPES:
            raise TypeError(f"attention(): '{name}' must be float16 or bfloat16, got {t.dtype}")
    head_dim = 1 if layout == "bhsd" else 2
    heads, kv_heads = q.shape[head_dim], k.shape[head_dim]
    grouped = heads % kv_heads == 0 if kv_heads else heads == 0
    for name, t in (("k", k), ("v", v)):
        want = q.shape[:head_dim] + (kv_heads,) + q.shape[head_dim + 1:]
        if t.shape != want or not grouped:
            raise ValueError(f"attention(): '{name}' has shape {tuple(t.shape)} but 'q' has "
                             f"{tuple(q.shape)}; they must match, except that k and v may have "
                             f"fewer heads (dim {head_dim}), a divisor of q's")
        if t.dtype != q.dtype:
            raise TypeError(f"attention(): '{name}' is {t.dtype} but 'q' is {q.dtype}; they must match")
        if t.device != q.device:
            raise ValueError(f"attention(): '{name}' is on {t.device} but 'q' is on {q.device}")
    dim = q.shape[-1]
    if dim % 8 or not HEAD_DIMS[0] <= dim <= HEAD_DIMS[1]:
        raise ValueError(f"attention(): the head dim (the last dim of 'q', 'k' and 'v') is {dim}; "
                         f"attention takes head dims that are multiples of 8 from {HEAD_DIMS[0]} "
                         f"to {HEAD_DIMS[1]}")
    return tuple(q.shape)


# --- torch.library: the forward with its backward ---------------------------------------------------
@torch.library.custom_op("tilews::attention", mutates_args=(),
                         schema="(Tensor q, Tensor k, Tensor v, bool is_causal, str layout) -> (Tensor, Tensor)")
def _attention_op(q, k, v, is_causal, layout):
    """(output, base-2 log-sum-exp): the forward that keeps what the backward reads."""
    return _forward(q.detach(), k.detach(), v.detach(), is_causal, layout, store_lse=True)


@_attention_op.register_fake
def _attention_fake(q, k, v, is_causal, layout):
    _check(q, k, v, layout)
    batch, heads, seq_len, dim, _ = operand_sizes(q, k, layout)
    rows = lse_rows(seq_len, blocks(dim, gpu=q.device.type == "cuda")["block_M"]) if seq_len else 0
    return torch.empty_like(q), q.new_empty((batch, heads, rows), dtype=torch.float32)


def _setup_backward(ctx, inputs, output):
    q, k, v, is_causal, layout = inputs
    ctx.save_for_backward(q, k, v, *output)
    ctx.is_causal, ctx.layout = is_causal, layout


def _backward(ctx, grad_out, grad_lse):
    q, k, v, out, lse = ctx.saved_tensors
    dq, dk, dv = torch.ops.tilews.attention_backward(grad_out, q, k, v, out, lse, ctx.is_causal,
                                                     ctx.layout)
    return dq, dk, dv, None, None


_attention_op.register_autograd(_backward, setup_context=_setup_backward)
