"""``T.call_extern`` / ``T.access_ptr`` / ``T.import_source`` (issue 39, the thread level):
device functions written in the tile language (``tilews.extern``), called per thread.

Each shipped decoder runs in a kernel of 32 threads, each decoding its own packed bytes (random,
poisoned output), against a numpy reference that performs the CUDA source's arithmetic bit by
bit (lop3: the magic-number float16 words and their f16x2 subtract/multiply steps; twiddling: the
bfloat16 words the masks build, times 2^126): exact equality. The layout test checks that a
decoder undoes ``interleave_weight``. The fp16 x int4 GEMV of TileLang's
``example_dequant_gemv_fp16xint4.py`` (``fast_decoding=True``) runs as TileLang writes it (its
reduction a ``T.tvm_thread_allreduce``), and the same GEMV with the block's partial sums added in
shared memory checks the decode inside a kernel of another form. Errors: a name with no implementation, at the user's line; an imported source that
does not define the called name; a pointer of the wrong dtype; a read past the pointed buffer.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

import tilews
import tilews.extern
import tilews.language as T
from tilews.extern import lop3

from .helpers import marked_line, poisoned

TARGETS = ["interpret", "triton"]
THREADS = 32


def build(factory, *args, target="interpret", **kwargs):
    return tilews.jit(out_idx=[], target=target)(factory)(*args, **kwargs)


# ---- the numpy reference: the CUDA source's arithmetic -------------------------------------------

_MEDIAN = {4: 8, 2: 2, 1: 0}


def _halves(words: np.ndarray) -> np.ndarray:
    """uint32 words [T, n/2] as float16 pairs [T, n] (low half first)."""
    return words.astype("<u4").view(np.float16)


def lop3_words(q: np.ndarray, b: int, n: int) -> np.ndarray:
    """The lop3 step: each thread's words ((x >> shift) & mask) | 0x64006400, as float16 pairs
    (1024 + field)."""
    q = q.astype(np.uint8).astype(np.uint32)
    if b == 4:
        x = q[:, 0] | q[:, 1] << 8 | q[:, 2] << 16 | q[:, 3] << 24
    elif b == 2:
        x = q[:, 0] | q[:, 1] << 16
    else:
        x = (q[:, 0] & 0x0F) | (q[:, 0] & 0xF0) << 12
    mask = {4: 0x000F000F, 2: 0x00030003, 1: 0x00010001}[b]
    words = np.stack([((x >> (b * i)) & mask) | 0x64006400 for i in range(n // 2)], axis=1)
    return _halves(words)


def f16_const(bits: int) -> np.float16:
    return np.array([bits], dtype=np.uint16).view(np.float16)[0]


def lop3_reference(name: str, q, scale=None, zeros=None, n=8, offset=0, group=0):
    """What BitBLAS's decoder ``name`` writes, per thread (rows)."""
    b = int(name[len("decode_i")])
    signed = name[len("decode_i") + 1] == "s"
    h = lop3_words(q, b, n)
    if "quantized" in name:
        z = np.asarray(zeros).astype(np.int64)
        if "offset" in name:
            z = (z >> (4 * group)) & 0xF
        halves = [(0xE400 | z[:, i]).astype(np.uint16).view(np.float16) for i in (0, offset)]
        h = h + _per_half(halves, n, "offset" in name)
        return h * _per_half([scale[:, 0], scale[:, offset]], n, "offset" in name)
    median = f16_const(0x6400 | (_MEDIAN[b] if signed else 0))
    h = h - median
    if signed and b == 1:
        h = h + h
        h = h + f16_const(0xBC00)
    if scale is None:
        return h
    s = _per_half([scale[:, 0], scale[:, offset]], n, "offset" in name)
    if zeros is None:
        return h * s
    z = _per_half([zeros[:, 0], zeros[:, offset]], n, "offset" in name)
    if "original" in name:
        return (h - z) * s
    if b == 2:                                       # rescale: multiply, then subtract
        return h * s - z
    fused = h.astype(np.float64) * s.astype(np.float64) - np.abs(z.astype(np.float64))
    return fused.astype(np.float16)                  # rescale: fma.rn, one rounding


def _per_half(pair, n: int, offsets: bool) -> np.ndarray:
    """Each thread's value for each of its n outputs: the first of ``pair`` for the first half
    (all of them without offsets), the second for the rest."""
    lo, hi = (np.asarray(v).reshape(-1, 1) for v in pair)
    cols = np.arange(n) < (n // 2 if offsets else n)
    return np.where(cols, lo, hi)


def twiddling_reference(q: np.ndarray, groups: int) -> torch.Tensor:
    """decode_fp4_to_bf16_twiddling: each byte pair's word v = (b0 << 8) | b1 masked into four
    bfloat16 words, times 2^126 (``ref_program_twiddling``'s arithmetic)."""
    q = q.astype(np.uint8).astype(np.int64)
    v = (q[:, 0::2] << 8) | q[:, 1::2]                               # [T, 2 * groups]
    mask = 0b1000000111000000
    words = [v & mask, (v << 3) & mask, (v << 6) & mask,
             ((v << 1) & 0x8000) | ((v >> 3) & 0x0180) | ((v >> 7) & 0x0040)]
    out = np.stack(words, axis=2).reshape(len(q), 8 * groups)       # pair p -> outputs 4p..
    bf = torch.from_numpy((out & 0xFFFF).astype(np.uint16).view(np.int16)).view(torch.bfloat16)
    return (bf.float() * 2.0 ** 126).to(torch.bfloat16)


# ---- the programs ------------------------------------------------------------------------------

def decoder_program(func_name, n_bytes, n_out, out_dtype, storage_dtype, args_of, source=None):
    """Each thread loads its n_bytes packed bytes into a local, calls ``func_name`` on pointers
    to it and to a local of n_out values (plus ``args_of(S, Z, tx)``: scale and zero pointers
    into global memory, then ints), and stores what it wrote. ``source``: TileLang's imported
    device source (a stand-in holding what the check reads)."""
    @T.prim_func
    def main(B: T.Tensor((THREADS * n_bytes,), storage_dtype),
             S: T.Tensor((2 * THREADS,), T.float16),
             Z: T.Tensor((2 * THREADS,), _zeros_dtype(func_name)),
             C: T.Tensor((THREADS * n_out,), out_dtype)):
        with T.Kernel(1, threads=THREADS):
            tx = T.get_thread_binding()
            q = T.alloc_local((n_bytes,), storage_dtype)
            d = T.alloc_local((n_out,), out_dtype)
            T.import_source(source)
            for v in T.vectorized(n_bytes):
                q[v] = B[tx * n_bytes + v]
            T.call_extern(func_name, T.access_ptr(q, "r"), T.access_ptr(d, "w"),
                          *args_of(S, Z, tx), dtype=out_dtype)
            for v in T.vectorized(n_out):
                C[tx * n_out + v] = d[v]
    return main


def _zeros_dtype(name: str):
    return T.int8 if "quantized" in name else T.float16


def _family(name: str) -> str:
    for tail in ("scale_zeros_quantized_offset", "scale_zeros_original_offset",
                 "scale_zeros_rescale_offset", "scale_offset", "scale_zeros_original",
                 "scale_zeros_rescale", "scale_zeros_quantized", "scale"):
        if name.endswith(tail):
            return tail
    return "plain"


def _call_args(name: str):
    """The call's arguments after the two pointers, in BitBLAS's order, and the reference's
    keywords."""
    s = lambda S, tx: T.access_ptr(S[2 * tx], "r", 2)      # noqa: E731
    return {
        "plain": (lambda S, Z, tx: (8,), {}),
        "scale": (lambda S, Z, tx: (s(S, tx), 8), {"scale": True}),
        "scale_offset": (lambda S, Z, tx: (s(S, tx), 1, 8), {"scale": True, "offset": 1}),
        "scale_zeros_original": (lambda S, Z, tx: (s(S, tx), s(Z, tx)), {"zeros": True}),
        "scale_zeros_rescale": (lambda S, Z, tx: (s(S, tx), s(Z, tx), 8), {"zeros": True}),
        "scale_zeros_quantized": (lambda S, Z, tx: (s(S, tx), s(Z, tx)), {"zeros": True}),
        "scale_zeros_original_offset": (lambda S, Z, tx: (s(S, tx), s(Z, tx), 1),
                                        {"zeros": True, "offset": 1}),
        "scale_zeros_rescale_offset": (lambda S, Z, tx: (s(S, tx), s(Z, tx), 1, 8),
                                       {"zeros": True, "offset": 1}),
        "scale_zeros_quantized_offset": (lambda S, Z, tx: (s(S, tx), s(Z, tx), 1, 1, 1),
                                         {"zeros": True, "offset": 1, "group": 1}),
    }[_family(name)]


def _inputs(name: str, n_bytes: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    q = torch.randint(-128, 128, (THREADS * n_bytes,), dtype=torch.int8, generator=g)
    # scales in [0.5, 2) and zeros in [0.5, 8) (or integers below 16): float32 holds every
    # product and difference exactly, so the fused multiply-add's one rounding is the reference's
    scale = (0.5 + 1.5 * torch.rand(2 * THREADS, generator=g)).half()
    if "quantized" in name:
        zeros = torch.randint(0, 16, (2 * THREADS,), dtype=torch.int8, generator=g)
        if "offset" in name:                 # two 4-bit zero points per byte; group 1 is used
            zeros = zeros | (torch.randint(0, 8, (2 * THREADS,), generator=g) << 4).to(torch.int8)
    else:
        zeros = (0.5 + 7.5 * torch.rand(2 * THREADS, generator=g)).half()
    return q, scale, zeros


def _bytes_per_call(name: str) -> int:
    return {4: 4, 2: 2, 1: 1}[int(name[len("decode_i")])]


TRITON_NAMES = ["decode_i4u_to_f16", "decode_i4s_to_f16_scale", "decode_i2s_to_f16",
                "decode_i1s_to_f16_scale", "decode_i4u_to_f16_scale_zeros_rescale",
                "decode_i2u_to_f16_scale_zeros_quantized",
                "decode_i4u_to_f16_scale_zeros_quantized_offset",
                "decode_i4u_to_f16_scale_zeros_original_offset"]
CASES = [(n, "interpret") for n in lop3.NAMES] + [(n, "triton") for n in TRITON_NAMES]


@pytest.mark.parametrize("name,target", CASES)
def test_lop3_decoder_matches_the_cuda_arithmetic(name, target):
    n_bytes = _bytes_per_call(name)
    args_of, ref_kw = _call_args(name)
    q, scale, zeros = _inputs(name, n_bytes, seed=len(name))
    c = poisoned(THREADS * 8, dtype=torch.float16)
    source = f"template <typename T1, typename T2> void {name}(T1 *q, T2 *d) {{ lop3.b32 }}"
    build(decoder_program, name, n_bytes, 8, T.float16, T.int8, args_of, source, target=target)(
        q, scale, zeros, c)
    s2 = scale.numpy().reshape(THREADS, 2)
    z2 = zeros.numpy().reshape(THREADS, 2)
    ref = lop3_reference(name, q.numpy().reshape(THREADS, n_bytes),
                         scale=s2 if ref_kw else None, zeros=z2 if "zeros" in ref_kw else None,
                         offset=ref_kw.get("offset", 0), group=ref_kw.get("group", 0))
    assert torch.equal(c.view(THREADS, 8), torch.from_numpy(np.asarray(ref, dtype=np.float16)))


def interleave(words: np.ndarray, b: int) -> np.ndarray:
    """``interleave_weight(w, b, "float16")`` on uint32 words, from its definition: element e
    (bits b*e) moves to bit 16 * (e % 2) + b * (e // 2); then, for b = 2, bytes 1 and 2 swap,
    and for b = 1 the nibbles 1..6 move to 2, 4, 6, 1, 3, 5."""
    out = np.zeros_like(words)
    for e in range(32 // b):
        out |= ((words >> (b * e)) & ((1 << b) - 1)) << (16 * (e % 2) + b * (e // 2))
    if b == 1:
        moved = out & 0xF000000F
        for src, dst in zip(range(1, 7), (2, 4, 6, 1, 3, 5)):
            moved |= ((out >> (4 * src)) & 0xF) << (4 * dst)
        return moved
    if b == 2:
        return (out & 0xFF0000FF) | ((out >> 8) & 0xFF) << 16 | ((out >> 16) & 0xFF) << 8
    return out


@pytest.mark.parametrize("b", [4, 2, 1])
def test_decoders_undo_interleave_weight(b):
    """decode(interleave(w)) is w's elements in their natural order (element j at bits b*j)."""
    g = torch.Generator().manual_seed(b)
    words = torch.randint(0, 2**32, (THREADS,), dtype=torch.int64, generator=g).numpy() \
        .astype(np.uint32)
    packed = interleave(words, b).view(np.int8).reshape(THREADS, 4)
    n_bytes = _bytes_per_call(f"decode_i{b}")
    q = torch.from_numpy(np.ascontiguousarray(packed[:, :n_bytes])).reshape(-1)
    c = poisoned(THREADS * 8, dtype=torch.float16)
    build(decoder_program, f"decode_i{b}u_to_f16", n_bytes, 8, T.float16, T.int8,
          lambda S, Z, tx: ())(q, torch.ones(2 * THREADS).half(), torch.ones(2 * THREADS).half(), c)
    natural = np.stack([(words >> (b * j)) & ((1 << b) - 1) for j in range(8)], axis=1)
    assert torch.equal(c.view(THREADS, 8), torch.from_numpy(natural.astype(np.float16)))


@pytest.mark.parametrize("storage", [T.uint8, T.int32])
def test_lop3_decoder_reads_any_integer_storage(storage):
    """The source pointer's element type only changes how its bytes are held."""
    words = torch.randint(-2**31, 2**31, (THREADS,), dtype=torch.int64,
                          generator=torch.Generator().manual_seed(7)).to(torch.int32)
    q = words if storage == T.int32 else words.view(torch.uint8)
    n = 1 if storage == T.int32 else 4
    c = poisoned(THREADS * 8, dtype=torch.float16)
    build(decoder_program, "decode_i4s_to_f16", n, 8, T.float16, storage,
          lambda S, Z, tx: ())(q, torch.ones(2 * THREADS).half(), torch.ones(2 * THREADS).half(), c)
    ref = lop3_reference("decode_i4s_to_f16", words.view(torch.int8).numpy().reshape(THREADS, 4))
    assert torch.equal(c.view(THREADS, 8), torch.from_numpy(ref))


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("groups", [1, 2])
def test_fp4_twiddling_decoder_matches_ref_program_twiddling(target, groups):
    g = torch.Generator().manual_seed(groups)
    q = torch.randint(0, 256, (THREADS * 4 * groups,), dtype=torch.uint8, generator=g)
    c = poisoned(THREADS * 8 * groups, dtype=torch.bfloat16)
    build(decoder_program, "decode_fp4_to_bf16_twiddling", 4 * groups, 8 * groups, T.bfloat16,
          T.uint8, lambda S, Z, tx: (groups,), target=target)(
        q, torch.ones(2 * THREADS).half(), torch.ones(2 * THREADS).half(), c)
    ref = twiddling_reference(q.numpy().reshape(THREADS, 4 * groups), groups)
    assert torch.equal(c.view(THREADS, -1), ref)


# ---- TileLang's fp16 x int4 GEMV ---------------------------------------------------------------

def dequantize_gemv(M, N, K, in_dtype="float16", out_dtype="float16", accum_dtype="float16",
                    num_bits=4, storage_dtype="int8", source_format="uint", n_partition=4,
                    reduce_thread=32, with_scaling=False, allreduce=True):
    """``example_dequant_gemv_fp16xint4.py``'s program (``fast_decoding=True``), as TileLang
    writes it. ``allreduce=False``: the partial sums of a row's threads are added into shared
    memory with element atomics instead of ``T.tvm_thread_allreduce``."""
    storage_nbit = 8
    num_elems_per_byte = storage_nbit // num_bits
    micro_size_k = 128 // 16
    micro_size_k_compressed = micro_size_k // num_elems_per_byte
    block_K = reduce_thread * micro_size_k
    func_name = f"decode_i{num_bits}{source_format[0]}_to_f16" + ("_scale" if with_scaling else "")
    import_source = f"__device__ void {func_name}(...) {{ /* lop3.b32 ... */ }}"

    @T.prim_func
    def main(A: T.Tensor((M, K), in_dtype), B: T.Tensor((N, K // 2), storage_dtype),
             C: T.Tensor((M, N), out_dtype)):
        with T.Kernel(T.ceildiv(N, n_partition), M, threads=(reduce_thread, n_partition)) as (
                bx, by):
            A_local = T.alloc_local((micro_size_k,), in_dtype)
            B_quant_local = T.alloc_local([micro_size_k_compressed], storage_dtype)
            B_dequantize_local = T.alloc_local([micro_size_k], in_dtype)
            accum_res = T.alloc_local((1,), accum_dtype)
            reduced_accum_res = T.alloc_local((1,), accum_dtype)
            row_sums = T.alloc_shared((n_partition,), accum_dtype)
            kr = T.thread_binding(0, reduce_thread, thread="threadIdx.x")
            ni = T.thread_binding(0, n_partition, thread="threadIdx.y")
            T.import_source(import_source)
            if not allreduce and kr == 0:
                row_sums[ni] = 0
            T.clear(accum_res)
            for ko in T.serial(T.ceildiv(K, block_K)):
                for v in T.vectorized(micro_size_k):
                    A_local[v] = A[by, ko * block_K + kr * micro_size_k + v]
                for v in T.vectorized(micro_size_k_compressed):
                    B_quant_local[v] = B[bx * n_partition + ni,
                                         ko * (reduce_thread * micro_size_k_compressed)
                                         + kr * micro_size_k_compressed + v]
                T.call_extern(func_name, T.access_ptr(B_quant_local, "r"),
                              T.access_ptr(B_dequantize_local, "w"), dtype=in_dtype)
                for ki in T.serial(micro_size_k):
                    accum_res[0] += A_local[ki] * B_dequantize_local[ki]
            if allreduce:
                with T.attr(T.comm_reducer(lambda x, y: x + y, [T.cast(0, accum_dtype)]),
                            "reduce_scope", T.reinterpret(T.uint64(0), dtype="handle")):
                    T.evaluate(T.tvm_thread_allreduce(T.uint32(1), accum_res[0], True,
                                                      reduced_accum_res[0], kr, dtype="handle"))
            else:
                T.atomic_add(row_sums[ni], accum_res[0])
                reduced_accum_res[0] = row_sums[ni]
            if kr == 0:
                C[by, bx * n_partition + ni] = reduced_accum_res[0]
    return main


def _gemv_operands(M, N, K):
    g = torch.Generator().manual_seed(39)
    a = torch.rand(M, K, generator=g).half()
    qb = torch.randint(0, 127, (N, K // 2), dtype=torch.int8, generator=g)
    words = qb.view(torch.int32).numpy().astype(np.uint32)
    b = torch.from_numpy(interleave(words, 4)).view(torch.int8).reshape(N, K // 2)
    u = qb.to(torch.uint8)                           # the example's int4 reference
    deq = torch.stack((u & 0x0F, u >> 4), dim=-1).reshape(N, K).double()
    return a, b, a.double() @ deq.T


@pytest.mark.parametrize("target", TARGETS + ["metal"])
def test_dequantize_gemv_fast_decoding(target):
    M, N, K = 1, 64, 256
    a, b, ref = _gemv_operands(M, N, K)
    c = poisoned(M, N, dtype=torch.float16)
    build(dequantize_gemv, M, N, K, target=target)(a, b, c)
    assert ((c.double() - ref).abs() / ref.abs()).max() < 1e-2    # float16 sums


@pytest.mark.parametrize("target", TARGETS + ["metal"])
def test_dequantize_gemv_decodes_inside_a_kernel(target):
    M, N, K = 1, 64, 256
    a, b, ref = _gemv_operands(M, N, K)
    c = poisoned(M, N, dtype=torch.float32)
    build(dequantize_gemv, M, N, K, "float16", "float32", "float32", allreduce=False,
          target=target)(a, b, c)
    assert ((c.double() - ref).abs() / ref.abs()).max() < 1e-3    # float16 products


# ---- errors --------------------------------------------------------------------------------------

def test_call_without_an_implementation_is_an_error_at_the_call():
    def f(n):
        @T.prim_func
        def main(B: T.Tensor((THREADS * 4,), T.int8), C: T.Tensor((THREADS * 8,), T.float16)):
            with T.Kernel(1, threads=THREADS):
                q = T.alloc_local((4,), T.int8)
                d = T.alloc_local((8,), T.float16)
                T.import_source("__device__ void decode_i3u_to_f16(...) {}")
                T.call_extern("decode_i3u_to_f16", T.access_ptr(q, "r"),  # <- error
                              T.access_ptr(d, "w"), dtype=T.float16)
        return main
    with pytest.raises(tilews.CompileError, match=r"no implementation of 'decode_i3u_to_f16'.*"
                                                  r"register") as info:
        build(f, 1)
    assert info.value.loc.line == marked_line(f)
    assert "tilews.extern.register_extern('decode_i3u_to_f16', impl)" in str(info.value)


def test_registered_implementation_is_called_per_thread():
    """A user's implementation: a macro over the pointers, with per-thread values."""
    @T.macro
    def widen_and_add(src, dst, n, bias):
        for k in T.vectorized(n):
            dst[k] = T.cast(src[k], T.float32) + bias

    tilews.extern.register_extern("widen_and_add", widen_and_add)

    def f():
        @T.prim_func
        def main(B: T.Tensor((THREADS * 4,), T.uint8), C: T.Tensor((THREADS * 4,), T.float32)):
            with T.Kernel(1, threads=THREADS):
                tx = T.get_thread_binding()
                d = T.alloc_local((4,), T.float32)
                T.call_extern("handle", "widen_and_add", T.access_ptr(B[tx * 4], "r", 4),
                              T.access_ptr(d, "w"), 4, tx)
                for v in T.vectorized(4):
                    C[tx * 4 + v] = d[v]
        return main
    b = torch.randint(0, 256, (THREADS * 4,), dtype=torch.uint8)
    c = poisoned(THREADS * 4)
    build(f)(b, c)
    assert torch.equal(c, b.float() + torch.arange(THREADS).repeat_interleave(4).float())


def _one_call(call, source=None):
    def f():
        @T.prim_func
        def main(B: T.Tensor((THREADS * 4,), T.int8), C: T.Tensor((THREADS * 8,), T.float16)):
            with T.Kernel(1, threads=THREADS):
                q = T.alloc_local((4,), T.int8)
                d = T.alloc_local((8,), T.float16)
                h = T.alloc_local((8,), T.bfloat16)
                T.import_source(source)
                call(q, d, h)
        return main
    return f


@pytest.mark.parametrize("source,call,message", [
    ("__device__ void decode_i2u_to_f16(...) { lop3.b32 }",
     lambda q, d, h: T.call_extern("decode_i4u_to_f16", T.access_ptr(q, "r"),
                                   T.access_ptr(d, "w")),
     "no source given to T.import_source mentions 'decode_i4u_to_f16'"),
    ("__device__ void decode_i4u_to_f16(...) { return; }",
     lambda q, d, h: T.call_extern("decode_i4u_to_f16", T.access_ptr(q, "r"),
                                   T.access_ptr(d, "w")),
     "not the function tilews implements under that name .*'lop3.b32'"),
    (None, lambda q, d, h: T.call_extern("decode_i4u_to_f16", T.access_ptr(q, "r"),
                                         T.access_ptr(h, "w")),
     "the output points at bfloat16, but the function reads or writes float16"),
    (None, lambda q, d, h: T.call_extern("decode_fp4_to_bf16_twiddling", T.access_ptr(q, "r"),
                                         T.access_ptr(h, "w")),     # N = 8 groups: 32 bytes
     "element 4 of 'q' .* outside the buffer, which holds 4 elements"),
    (None, lambda q, d, h: T.call_extern("decode_i4u_to_f16", T.access_ptr(q, "r", 2),
                                         T.access_ptr(d, "w")),
     "element 2 through T.access_ptr\\('q'\\) is outside the 2 elements the pointer covers"),
    (None, lambda q, d, h: T.call_extern("decode_i4u_to_f16", q, T.access_ptr(d, "w")),
     "the packed source must be a T.access_ptr"),
])
def test_call_errors_name_the_problem(source, call, message):
    with pytest.raises(tilews.CompileError, match=message):
        build(_one_call(call, source))
