"""Thread-level programs on Hopper (issue 39): which reach the warp-specialized Gluon path, and
why the others go to ``tl``.

* ``mxfp4_gemm`` is TileLang's ``example_dequant_gemm_bf16_mxfp4_hopper.py`` with
  ``fast_dequant=False``: each ``T.Pipelined`` step copies a packed FP4 tile of B into shared
  memory, unpacks it with fragment math that reads the packed byte of column ``j`` at ``j // 2``
  (a gather along the row: ``gl.gather``) and scales it by ``2 ** Scale``, stores the bf16 tile
  into shared memory and feeds ``T.gemm``. It compiles for sm_90 warp-specialized (producer
  partition, ``warp_group_dot``, TMA copies, mbarriers); its lowered Hopper program and the
  ``interpret`` target match a float64 reference.
* ``mxfp4_gemm_fast`` is the same example with ``fast_dequant=True``: per thread, 4 packed bytes
  loaded from the shared tile at ``tx``-computed indices (one aligned run of the tile per step:
  ``lowering/chunks.py``), decoded by ``T.call_extern`` (tilews.extern's twiddling decoder),
  scaled, and 8 values stored into the bf16 shared tile as one run. Gluon loads and stores each
  run as a row slice of the tile (the step loop unrolled, so each run's first row is known when
  the kernel is compiled), so it stays warp-specialized; its lowered Hopper program matches the
  reference on the interpreter.
* ``int4_gemm_chunks`` unpacks int4 per thread the same way; ``int4_gemm_threads`` stores each
  thread's values at strided indices instead (no run of the tile): Gluon has no element address
  in shared memory, so the Gluon backend refuses it, naming that store and its line;
  ``interpret`` matches a float64 reference for all three.
* A split-K GEMV has no tile operation at all: nothing to warp-specialize, so the chain's
  choice is ``tl``, with the reason in the report (and its per-thread atomic into shared memory
  is a second reason Gluon could not spell it).
"""
from __future__ import annotations

import re

import pytest
import torch

import tilews
import tilews.language as T
from tilews.lowering import interpreter, ir
from tilews.lowering.frontend import build_kernel
from tilews.lowering.pipeline import lower
from tilews.lowering.plans import AsyncPlan, AsyncRefusal
from tilews.lowering.traverse import walk
from tilews.triton_ext.gluon.backend import HOPPER

from .helpers import gluon_program, marked_line, poisoned, randn
from .test_threads_extern import twiddling_reference
from .thread_programs import splitk_gemv

TOL = dict(rtol=1e-2, atol=1e-2)


def fp4_to_bf16(val, pos):
    """Nibble ``pos`` of the byte ``val`` (sign, 2 exponent bits, 1 mantissa bit) as bf16."""
    f4 = (val >> (pos.astype(T.uint16) * 4)) & 15
    sign = f4 >> 3
    exp = ((f4 & 6) >> 1) + 126
    man = f4 & 1
    return T.reinterpret(((((sign << 8) | exp) << 7) | (man << 6)).astype(T.uint16), T.bfloat16)


def mxfp4_gemm(M, N, K, block_M=128, block_N=128, block_K=128, num_stages=2, threads=256,
               scale_size=32, fast_dequant=False):
    QK, Block_QK = K // 2, block_K // 2
    local_size, local_compress_size = 8, 4          # 128-bit transactions of bf16; 2 per byte

    @T.macro
    def simple_dequant(B_shared, B_dequantize_shared, Scale, k):
        B_local = T.alloc_fragment((block_N, Block_QK), T.uint8)
        B_dequantize_local = T.alloc_fragment((block_N, block_K), T.bfloat16)
        bx = T.get_block_binding(0)
        T.copy(B_shared, B_local)
        for i, j in T.Parallel(block_N, block_K):
            s = Scale[bx * block_N + i, k * block_K // scale_size + j // scale_size]
            B_dequantize_local[i, j] = fp4_to_bf16(B_local[i, j // 2], j % 2) * T.shift_left(1, s)
        T.copy(B_dequantize_local, B_dequantize_shared)

    @T.macro
    def fast_dequant_bf16_fp4_twiddling(B_shared, B_dequantize_shared, Scale, k):
        tx = T.get_thread_binding()
        bx = T.get_block_binding(0)
        B_local_thread = T.alloc_local((local_compress_size,), T.uint8)
        B_dequantize_local_thread = T.alloc_local((local_size,), T.bfloat16)
        Scale_local_thread = T.alloc_local((1,), T.uint8)
        Scale_local_thread_exponent = T.alloc_local((1,), T.bfloat16)
        for i in T.serial(0, block_N * block_K // threads // local_size):
            index_base = i * threads * local_compress_size + tx * local_compress_size
            for v in T.vectorized(0, local_compress_size):
                index = index_base + v
                B_local_thread[v] = B_shared[index // Block_QK, index % Block_QK]
            index_scale = index_base // (scale_size // 2)
            si = index_scale // (block_K // scale_size)
            sj = index_scale % (block_K // scale_size)
            Scale_local_thread[0] = Scale[bx * block_N + si, k * block_K // scale_size + sj]
            Scale_local_thread_exponent[0] = T.shift_left(1, (Scale_local_thread[0]))
            T.call_extern("decode_fp4_to_bf16_twiddling", T.access_ptr(B_local_thread, "r"),
                          T.access_ptr(B_dequantize_local_thread, "w"), 1, dtype=T.bfloat16)
            for v in T.vectorized(local_size):
                B_dequantize_local_thread[v] *= Scale_local_thread_exponent[0]
            for v in T.vectorized(0, local_size):
                index = i * threads * local_size + tx * local_size + v
                B_dequantize_shared[index // block_K, index % block_K] = B_dequantize_local_thread[v]

    @T.prim_func
    def main(A: T.Tensor((M, K), T.bfloat16), B: T.Tensor((N, QK), T.uint8),
             Scale: T.Tensor((N, K // scale_size), T.uint8), C: T.Tensor((M, N), T.bfloat16)):
        with T.Kernel(T.ceildiv(N, block_N), T.ceildiv(M, block_M), threads=threads) as (bx, by):
            A_shared = T.alloc_shared((block_M, block_K), T.bfloat16)
            B_shared = T.alloc_shared((block_N, Block_QK), T.uint8)
            B_dequantize_shared = T.alloc_shared((block_N, block_K), T.bfloat16)
            C_local = T.alloc_fragment((block_M, block_N), T.float32)
            C_shared = T.alloc_shared((block_M, block_N), T.bfloat16)
            T.clear(C_local)
            for k in T.Pipelined(K // block_K, num_stages=num_stages):
                T.copy(A[by * block_M, k * block_K], A_shared)
                T.copy(B[bx * block_N, k * Block_QK], B_shared)
                if fast_dequant:
                    fast_dequant_bf16_fp4_twiddling(B_shared, B_dequantize_shared, Scale, k)
                else:
                    simple_dequant(B_shared, B_dequantize_shared, Scale, k)
                T.gemm(A_shared, B_dequantize_shared, C_local, transpose_B=True)
            T.copy(C_local, C_shared)
            T.copy(C_shared, C[by * block_M, bx * block_N])
    return main


def mxfp4_gemm_fast(M, N, K, **config):
    """TileLang's example with ``fast_dequant=True`` (its ``fast_dequant_bf16_fp4_twiddling``)."""
    return mxfp4_gemm(M, N, K, fast_dequant=True, **config)


def int4_gemm_chunks(M, N, K, **config):
    """``int4_gemm_threads`` with each thread's 8 values decoded into a local and stored as one
    run of the shared tile (as the mxfp4 example's fast path does)."""
    return int4_gemm_threads(M, N, K, store_runs=True, **config)


def int4_gemm_threads(M, N, K, block_M=128, block_N=128, block_K=64, num_stages=2, threads=128,
                      store_runs=False, first_step_of_block=False):
    """C = A @ dequant(B)^T, B's int4 values (offset 8) two per byte, one scale per row of B,
    unpacked per thread inside the pipelined loop; each thread stores its values at strided
    indices, or (``store_runs``) as one run of the tile. ``first_step_of_block``: the step loop
    starts at ``bx // N`` (0, but known only at run time)."""
    Block_QK = block_K // 2
    per_thread = 4                      # packed bytes a thread unpacks per step
    steps = block_N * Block_QK // (threads * per_thread)

    @T.macro
    def unpack_strided(B_dequantize, packed, Scale, base):
        bx = T.get_block_binding(0)
        for v in T.serial(per_thread):
            e = (base + v) * 2
            row = e // block_K
            s = Scale[bx * block_N + row]
            B_dequantize[row, e % block_K] = ((packed[v] & 15).astype(T.float16) - 8) * s  # <- store
            B_dequantize[row, e % block_K + 1] = ((packed[v] >> 4).astype(T.float16) - 8) * s

    @T.prim_func
    def main(A: T.Tensor((M, K), T.float16), B: T.Tensor((N, K // 2), T.uint8),
             Scale: T.Tensor((N,), T.float16), C: T.Tensor((M, N), T.float16)):
        with T.Kernel(T.ceildiv(N, block_N), T.ceildiv(M, block_M), threads=threads) as (bx, by):
            A_shared = T.alloc_shared((block_M, block_K), T.float16)
            B_shared = T.alloc_shared((block_N, Block_QK), T.uint8)
            B_dequantize = T.alloc_shared((block_N, block_K), T.float16)
            C_local = T.alloc_fragment((block_M, block_N), T.float32)
            packed = T.alloc_local((per_thread,), T.uint8)
            values = T.alloc_local((2 * per_thread,), T.float16)
            tx = T.get_thread_binding()
            T.clear(C_local)
            for k in T.Pipelined(K // block_K, num_stages=num_stages):
                T.copy(A[by * block_M, k * block_K], A_shared)
                T.copy(B[bx * block_N, k * Block_QK], B_shared)
                for i in T.serial(bx // N if first_step_of_block else 0, steps):
                    base = (i * threads + tx) * per_thread
                    for v in T.vectorized(per_thread):
                        packed[v] = B_shared[(base + v) // Block_QK, (base + v) % Block_QK]  # <- read
                    if store_runs:
                        s = Scale[bx * block_N + base * 2 // block_K]
                        for v in T.vectorized(2 * per_thread):
                            values[v] = (((packed[v // 2] >> (4 * (v % 2))) & 15).astype(T.float16) - 8) * s
                        for v in T.vectorized(2 * per_thread):
                            B_dequantize[(base * 2 + v) // block_K, (base * 2 + v) % block_K] = values[v]
                    else:
                        unpack_strided(B_dequantize, packed, Scale, base)
                T.gemm(A_shared, B_dequantize, C_local, transpose_B=True)
            T.copy(C_local, C[by * block_M, bx * block_N])
    return main


# ----------------------------------------------------------------------------------------------
# references (float64)


def fp4_reference(packed: torch.Tensor) -> torch.Tensor:
    """(N, K/2) bytes -> (N, K) float64: low nibble first, (-1)^s * 2^(e - 1) * (1 + m / 2)."""
    nibbles = torch.stack((packed & 15, packed >> 4), dim=-1).reshape(packed.shape[0], -1).long()
    sign = 1 - 2 * (nibbles >> 3)
    exp = (nibbles & 6) >> 1
    man = nibbles & 1
    return sign * torch.pow(2.0, exp.double() - 1) * (1 + man.double() / 2)


def mxfp4_inputs(M, N, K, seed=0):
    g = torch.Generator().manual_seed(seed)
    A = randn(M, K, dtype=torch.bfloat16, seed=seed)
    qB = torch.randint(0, 256, (N, K // 2), generator=g, dtype=torch.uint8)
    Scale = torch.randint(0, 4, (N, K // 32), generator=g, dtype=torch.uint8)
    return A, qB, Scale


def mxfp4_reference(A, qB, Scale):
    B = fp4_reference(qB) * torch.pow(2.0, Scale.double()).repeat_interleave(32, dim=1)
    return A.double() @ B.T


def mxfp4_twiddled_reference(A, qB, Scale):
    """``ref_program_twiddling``: B decoded by the twiddling layout, times 2^Scale per 32 columns."""
    B = twiddling_reference(qB.numpy(), qB.shape[1] // 4).double()
    B = B * torch.pow(2.0, Scale.double()).repeat_interleave(32, dim=1)
    return A.double() @ B.T


def int4_inputs(M, N, K, seed=0):
    g = torch.Generator().manual_seed(seed)
    A = randn(M, K, dtype=torch.float16, seed=seed)
    qB = torch.randint(0, 256, (N, K // 2), generator=g, dtype=torch.uint8)
    Scale = (torch.rand(N, generator=g) * 0.1 + 0.01).to(torch.float16)
    return A, qB, Scale


def int4_reference(A, qB, Scale):
    values = torch.stack((qB & 15, qB >> 4), dim=-1).reshape(qB.shape[0], -1).double() - 8
    return A.double() @ (values * Scale.double()[:, None]).T


def close(out: torch.Tensor, ref: torch.Tensor) -> None:
    assert not out.isnan().any()
    scale = ref.abs().max().item()
    err = (out.double() - ref).abs().max().item()
    assert err <= TOL["atol"] * scale + TOL["rtol"] * scale, (err, scale)


# ----------------------------------------------------------------------------------------------
# the dequantizing GEMM of TileLang's example (tile-level unpacking): warp-specialized on Gluon


MX = I4 = (256, 256, 256)

# program, its inputs, its reference, the output's dtype
DEQUANT_GEMMS = {"mxfp4_tile_level": (mxfp4_gemm, mxfp4_inputs, mxfp4_reference, torch.bfloat16),
                 "mxfp4_fast_dequant": (mxfp4_gemm_fast, mxfp4_inputs, mxfp4_twiddled_reference,
                                        torch.bfloat16),
                 "int4_per_thread_runs": (int4_gemm_chunks, int4_inputs, int4_reference, torch.float16),
                 "int4_per_thread": (int4_gemm_threads, int4_inputs, int4_reference, torch.float16)}


@pytest.mark.parametrize("name", sorted(DEQUANT_GEMMS))
def test_dequant_gemm_numerics_interpret(name):
    program, inputs, reference, out_dtype = DEQUANT_GEMMS[name]
    A, qB, Scale = inputs(*MX)
    C = poisoned(MX[0], MX[1], dtype=out_dtype)
    tilews.compile(program(*MX), target="interpret")(A, qB, Scale, C)
    close(C, reference(A, qB, Scale))


@pytest.mark.parametrize("name", ["mxfp4_tile_level", "mxfp4_fast_dequant", "int4_per_thread_runs"])
def test_dequant_gemm_lowered_for_hopper_matches_reference(name):
    """The program as the Gluon backend receives it (roles, rings, barriers; per-thread code
    inside the consumer role) on the interpreter."""
    program, inputs, reference, out_dtype = DEQUANT_GEMMS[name]
    lowered = lower(build_kernel(program(*MX)), HOPPER)
    assert lowered.find_plan(AsyncPlan) is not None, lowered.find_plan(AsyncRefusal)
    A, qB, Scale = inputs(*MX, seed=1)
    C = poisoned(MX[0], MX[1], dtype=out_dtype)
    interpreter.run(lowered, [A, qB, Scale, C], seed=1)
    close(C, reference(A, qB, Scale))


def test_mxfp4_gemm_compiles_warp_specialized_for_sm90():
    kernel = tilews.compile(mxfp4_gemm(*MX), target="hopper")
    assert kernel.report.target == "hopper", kernel.report.notes
    ttgir = gluon_program(lower(build_kernel(mxfp4_gemm(*MX)), HOPPER)).asm["ttgir"]
    assert len(re.findall(r"ttg\.warp_specialize\(", ttgir)) == 1
    # the producer partition: one warp issuing the TMA copies of A and packed B
    assert re.findall(r"partition\d+\(.*\) num_warps\((\d+)\)", ttgir) == ["1"]
    assert len(re.findall(r"ttng\.async_tma_copy_global_to_local", ttgir)) == 2
    assert re.search(r"ttng\.warp_group_dot .*isAsync = true", ttgir)
    assert "ttng.init_barrier" in ttgir and "ttng.wait_barrier" in ttgir
    assert "ttng.barrier_expect" in ttgir
    # B_local[i, j // 2] is a gather of the packed tile along its row; the bf16 tile is stored
    # to shared memory and fenced before wgmma reads it
    assert re.search(r"tt\.gather .*\{axis = 1 : i32\}", ttgir)
    assert "ttng.fence_async_shared" in ttgir


# ----------------------------------------------------------------------------------------------
# per-thread dequantization reading and writing runs of shared tiles: warp-specialized on Gluon


@pytest.mark.parametrize("name", ["mxfp4_fast_dequant", "int4_per_thread_runs"])
def test_per_thread_dequant_plans_runs_of_shared_tiles(name):
    """legalize_wgmma's plan: the packed bytes read from B_shared's ring slot and the values
    written to the tile wgmma reads, each as runs of whole rows (16 per step), the step loop
    unrolled (each run a row slice at a compile-time row), and a proxy fence between those
    stores and the wgmma."""
    program = DEQUANT_GEMMS[name][0]
    lowered = lower(build_kernel(program(*MX)), HOPPER)
    plan = lowered.find_plan(AsyncPlan)
    assert plan is not None, lowered.find_plan(AsyncRefusal)
    dequantized = {"mxfp4_fast_dequant": "B_dequantize_shared", "int4_per_thread_runs": "B_dequantize"}
    assert [(c.buffer, c.slots, c.rows) for c in plan.shared_chunks] == \
        [("B_shared", 1, 16), (dequantized[name], 0, 16)]
    consumer = [s for s in walk(lowered.body) if isinstance(s, ir.Role)][-1]
    steps = [s for s in walk(consumer.body) if isinstance(s, ir.For) and s.var.name == "i"]
    assert [s.kind for s in steps] == [ir.ForKind.UNROLL]
    order = [type(s).__name__ for s in walk(consumer.body) if isinstance(s, (ir.ProxyFence, ir.Gemm))]
    assert order[:2] == ["ProxyFence", "Gemm"], order


@pytest.mark.parametrize("name", ["mxfp4_fast_dequant", "int4_per_thread_runs"])
def test_per_thread_dequant_compiles_warp_specialized_for_sm90(name):
    program = DEQUANT_GEMMS[name][0]
    kernel = tilews.compile(program(*MX), target="hopper")
    assert kernel.report.target == "hopper", kernel.report.notes          # no fallback to tl
    ttgir = gluon_program(lower(build_kernel(program(*MX)), HOPPER)).asm["ttgir"]
    assert len(re.findall(r"ttg\.warp_specialize\(", ttgir)) == 1
    assert re.findall(r"partition\d+\(.*\) num_warps\((\d+)\)", ttgir) == ["1"]
    assert len(re.findall(r"ttng\.async_tma_copy_global_to_local", ttgir)) == 2
    assert re.search(r"ttng\.warp_group_dot .*isAsync = true", ttgir)
    # each step's run of packed bytes is one load from the ring slot, its decoded run one store
    # into the tile wgmma reads (8 steps, unrolled; and C's staging store), fenced before the
    # wgmma; each run is a row slice of the 2-d tile itself, so Triton addresses it in the tile's
    # layout (a [chunks, rows, cols] view indexed at run time put columns 64.. of a 128-column
    # bf16 tile at the wrong addresses: wgmma read a permuted B on the GPU)
    assert len(re.findall(r"ttg\.local_load", ttgir)) == 8
    assert len(re.findall(r"ttg\.local_store", ttgir)) == 9
    assert "ttng.fence_async_shared" in ttgir
    source = gluon_program(lower(build_kernel(program(*MX)), HOPPER)).source
    assert "_reinterpret(gl.bfloat16, [8," not in source and "_reinterpret(gl.float16, [8," not in source
    assert re.search(r"B_dequantize(_shared)?\.slice\(.* // \d+, 16\)\.store\(", source)


@pytest.mark.parametrize("name", ["mxfp4_fast_dequant", "int4_per_thread_runs"])
def test_per_thread_stores_are_ordered_before_and_after_the_wgmma(name):
    """In the consumer partition (PTX; Triton inserts the barriers when lowering to LLVM, so the
    TTGIR has none): every thread's stores of the dequantized runs, then its proxy fence, then a
    barrier of all the partition's threads, before the wgmma reads the tile; and after each
    wgmma's wait, a barrier of the partition before the next step's stores overwrite the tile."""
    program = DEQUANT_GEMMS[name][0]
    ptx = gluon_program(lower(build_kernel(program(*MX)), HOPPER)).asm["ptx"]
    threads = {"mxfp4_fast_dequant": 256, "int4_per_thread_runs": 128}[name]
    ops = re.findall(r"^\s*(st\.shared\.v4|fence\.proxy\.async|bar\.sync\s+0, \d+|"
                     r"wgmma\.mma_async|wgmma\.wait_group)", ptx, flags=re.M)
    ops = [re.sub(r"\s+", " ", o) for o in ops]
    barrier = f"bar.sync 0, {threads}"
    first_mma, wait = ops.index("wgmma.mma_async"), ops.index("wgmma.wait_group")
    before = ops[:first_mma]
    last_store = len(before) - 1 - before[::-1].index("st.shared.v4")
    assert before[last_store:] == ["st.shared.v4", "fence.proxy.async", barrier], before[last_store:]
    assert ops[wait + 1] == barrier, ops[wait:wait + 3]


# ----------------------------------------------------------------------------------------------
# per-thread stores at strided indices: Gluon refuses them, saying why


def test_int4_gemm_threads_gluon_refusal_names_the_per_thread_access():
    """The pipelined loop has a warp-specialized form, and the per-thread read of B_shared is a
    run of the tile; what Gluon cannot spell is the store of each thread's values at strided
    indices (no run of B_dequantize)."""
    prog = int4_gemm_threads(*I4)
    lowered = lower(build_kernel(prog), HOPPER)
    assert any(n.startswith("warp_specialize: T.Pipelined") for n in lowered.notes), lowered.notes
    refusal = lowered.find_plan(AsyncRefusal)
    assert refusal is not None
    line = marked_line(int4_gemm_threads, "# <- store")
    assert refusal.reason == (
        f"per-thread code at line {line} stores into shared buffer 'B_dequantize' at "
        f"thread-computed indices: Gluon reads and writes shared memory only as whole tiles, not "
        f"at per-thread indices")
    kernel = tilews.compile(prog, target="hopper")
    assert kernel.report.target == "hopper -> triton", kernel.report.notes


def test_per_thread_run_at_a_run_time_row_is_refused_naming_the_loop():
    """A run of a shared tile is a row slice at a row known when the kernel is compiled: a step
    loop starting at a block-dependent value cannot be unrolled, so Gluon refuses, naming the
    loop's variable and the line, and tl compiles it (the interpreter computes it right)."""
    prog = int4_gemm_threads(*I4, store_runs=True, first_step_of_block=True)
    refusal = lower(build_kernel(prog), HOPPER).find_plan(AsyncRefusal)
    assert refusal is not None
    line = marked_line(int4_gemm_threads, "# <- read")
    assert re.fullmatch(rf"per-thread code at line {line} reads or writes a run of shared "
                        rf"buffer 'B_shared' starting at a row that depends on 'i', known only at "
                        rf"run time: .*", refusal.reason), refusal.reason
    assert tilews.compile(prog, target="hopper").report.target == "hopper -> triton"
    A, qB, Scale = int4_inputs(*I4)
    C = poisoned(I4[0], I4[1], dtype=torch.float16)
    tilews.compile(prog, target="interpret")(A, qB, Scale, C)
    close(C, int4_reference(A, qB, Scale))


# ----------------------------------------------------------------------------------------------
# a kernel with no tile operations: tl is the chain's choice, and the report says why


def test_splitk_gemv_goes_to_tl_with_the_reason():
    lowered = lower(build_kernel(splitk_gemv(256, 512, 4, 32)), HOPPER)
    refusal = lowered.find_plan(AsyncRefusal)
    assert refusal is not None and refusal.reason.startswith(
        "the program has no warp-specialized form"), refusal


def test_naive_gemv_compiles_on_tl_for_hopper():
    """A per-thread GEMV (one output row per thread) through the whole chain: Gluon refuses, tl
    compiles it, the report's notes say so."""
    BLOCK_N, BLOCK_K = 128, 32

    @T.prim_func
    def gemv(A: T.Tensor((256,), T.float16), B: T.Tensor((256, 256), T.float16),
             C: T.Tensor((256,), T.float16)):
        with T.Kernel(T.ceildiv(256, BLOCK_N), threads=BLOCK_N) as bn:
            tn = T.get_thread_binding(0)
            B_shared = T.alloc_shared((BLOCK_N, BLOCK_K), T.float16)
            C_reg = T.alloc_local((1,), T.float32)
            T.clear(C_reg)
            for bk in T.serial(T.ceildiv(256, BLOCK_K)):
                for tk in T.serial(BLOCK_K):
                    B_shared[tn, tk] = B[bn * BLOCK_N + tn, bk * BLOCK_K + tk]
                for tk in T.serial(BLOCK_K):
                    C_reg[0] += A[bk * BLOCK_K + tk].astype(T.float32) * \
                        B_shared[tn, tk].astype(T.float32)
            C[bn * BLOCK_N + tn] = C_reg[0]

    kernel = tilews.compile(gemv, target="hopper")
    assert kernel.report.target == "hopper -> triton", kernel.report.notes
    assert any("the gluon backend refused the program (the program has no warp-specialized form"
               in n and n.endswith("using tl") for n in kernel.report.notes), kernel.report.notes
