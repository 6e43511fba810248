"""The Gluon backend (Hopper, sm_90a): emitted source and compile-only builds.

Kernels come from the frontend (``examples/gemm.py``'s ``matmul``, ``examples/ws_gemm.py``'s
``ws_matmul_program`` and small variants written here), are lowered with ``lower(kernel,
HOPPER)``, emitted, and compiled for ``GPUTarget("cuda", 90, 32)`` in a child process (no GPU
needed). The assertions read the TTGIR and PTX: one ``ttg.warp_specialize`` with the producer's
warps and registers, the accumulator layout, ``wgmma.mma_async`` shapes and counts (a merged
``T.ws(1, 2)`` consumer splits M between its two warp groups), TMA loads and the TMA store,
``mbarrier`` init counts / expect bytes / waits / arrivals, ``setmaxnreg``, ``fence.proxy.async``
and the absence of spills. Expected values are computed from each case's block sizes, not read
back from the kernel. The block-sparse case (docs/ws-semantics.md #8) also checks that the mask guard
(a scalar load) stays around each role's TMA loads and wgmma, and that the iteration counters are
loop-carried values. ``test_numerics_on_gpu`` runs every case on an sm_90 GPU (skipped elsewhere)
against torch.
"""
from __future__ import annotations

import dataclasses
import functools
import re
from pathlib import Path

import pytest
import torch

import tilews
import tilews.language as T
from tilews.lowering import interpreter, ir
from tilews.lowering.errors import InternalError
from tilews.lowering.frontend import build_kernel
from tilews.lowering.passes import legalize_wgmma
from tilews.lowering.pipeline import lower
from tilews.triton_ext.gluon.backend import HOPPER
from tilews.triton_ext.tl.backend import TRITON_CPU
from tilews.lowering.traverse import transform, walk
from tilews.lowering.plans import AsyncPlan, AsyncRefusal, SharedMemoryPlan
from tilews.triton_ext.gluon import GluonProgram, emit
from tilews.triton_ext.toolchain import triton_version
from tilews.triton_ext.gluon import launch as gluon_launch

from examples.gemm import matmul
from examples.ws_gemm import ws_matmul_program, ws_ring_matmul_program

from .helpers import GRID_WAIT, gluon_program, poisoned, randn, rel_err, services, unwaited_global_accesses
from .test_tl_backend import gemm as tl_gemm
from .test_ws_oracle import block_sparse_gemm

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


# ----------------------------------------------------------------------------------------------
# kernels


def explicit_gemm(M, N, K, bm, bn, bk, dtype=T.float16):
    """An explicit producer T.ws(0) and ONE single-warp-group consumer T.ws(1), iterating over a
    runtime number of K tiles (a scalar parameter)."""
    @T.prim_func
    def main(A, B, C, tiles):
        with T.Kernel(T.ceildiv(N, bn), T.ceildiv(M, bm), threads=256) as (bx, by):
            A_s = T.alloc_shared((bm, bk), dtype)
            B_s = T.alloc_shared((bk, bn), dtype)
            C_f = T.alloc_fragment((bm, bn), T.float32)
            ready = T.alloc_barrier(arrive_count=128)
            done = T.alloc_barrier(arrive_count=128)
            with T.ws(1):
                T.clear(C_f)
            for ko in range(tiles):
                with T.ws(0):
                    T.barrier_wait(done, (ko + 1) % 2)
                    T.copy(A[by * bm, ko * bk], A_s)
                    T.copy(B[ko * bk, bx * bn], B_s)
                    T.barrier_arrive(ready)
                with T.ws(1):
                    T.barrier_wait(ready, ko % 2)
                    T.gemm(A_s, B_s, C_f)
                    T.barrier_arrive(done)
            with T.ws(1):
                T.copy(C_f, C[by * bm, bx * bn])
    return build_kernel(main, {"A": T.Tensor((M, K), dtype), "B": T.Tensor((K, N), dtype),
                               "C": T.Tensor((M, N), dtype), "tiles": T.int32})


def explicit_merged(M, N, K, bm, bn, bk):
    return build_kernel(ws_matmul_program(M, N, K, block_M=bm, block_N=bn, block_K=bk))


def auto(M, N, K, bm, bn, bk, stages, threads=128):
    """examples/gemm.py's kernel; threads=256 gives the consumer two warp groups."""
    return build_kernel(matmul.fn(M, N, K, block_M=bm, block_N=bn, block_K=bk, num_stages=stages,
                                  threads=threads))


@dataclasses.dataclass(frozen=True)
class Case:
    make: object                # () -> the frontend's kernel
    M: int
    N: int
    K: int
    bm: int
    bn: int
    bk: int
    stages: int                 # ring depth (an explicit program's one-slot handshake: the ring
                                # ring_handshakes makes of it, as deep as shared memory holds)
    consumer_groups: int        # warp groups of the role holding the accumulator
    dtype: str = "f16"
    transpose_b: bool = False
    scalars: tuple = ()         # values of the kernel's scalar parameters at launch
    sparse: bool = False        # takes a block mask (row blocks x K tiles) after B


CASES = {
    # automatic WS of examples/gemm.py (threads=128): producer + one consumer warp group
    "auto_1wg": Case(lambda: auto(512, 512, 256, 128, 128, 64, 3), 512, 512, 256, 128, 128, 64, 3, 1),
    # threads=256, 128x256 tile: the consumer is ONE role of two warp groups, M split
    "auto_merged": Case(lambda: auto(512, 512, 256, 128, 256, 64, 3, threads=256),
                        512, 512, 256, 128, 256, 64, 3, 2),
    # bf16, B given K-major ([N, K]) and read through a permuted shared view; swizzled blocks
    "auto_bf16_transpose_b": Case(lambda: tl_gemm(256, 256, 256, T.bfloat16, 128, 128, 64,
                                                  transpose_b=True, swizzle=2, stages=2),
                                  256, 256, 256, 128, 128, 64, 2, 1, "bf16", True),
    "explicit_ws0_ws1": Case(lambda: explicit_gemm(256, 256, 256, 128, 128, 64),
                             256, 256, 256, 128, 128, 64, 4, 1, scalars=(4,)),
    # examples/ws_gemm.py: producer T.ws(0) + merged consumer T.ws(1, 2)
    "explicit_merged_bm128": Case(lambda: explicit_merged(256, 512, 256, 128, 128, 64),
                                  256, 512, 256, 128, 128, 64, 4, 2),
    "explicit_merged_bm256": Case(lambda: explicit_merged(512, 256, 256, 256, 128, 64),
                                  512, 256, 256, 256, 128, 64, 3, 2),
    # examples/ws_gemm.py's ring: full/empty pairs indexed by the iteration, one wgmma in flight
    "explicit_ring_merged": Case(lambda: build_kernel(ws_ring_matmul_program(512, 512, 512, stages=3)),
                                 512, 512, 512, 128, 256, 64, 3, 2, "bf16"),
    # docs/ws-semantics.md #8: the loop body is guarded by BlockMask[by, k]; each role keeps the guard and
    # counts the iterations that ran (ring slot and phase follow the count)
    "block_sparse": Case(lambda: build_kernel(block_sparse_gemm(512, 512, 512, 128, 256, 64, 3, threads=256,
                                                                dtype=T.bfloat16)),
                         512, 512, 512, 128, 256, 64, 3, 2, "bf16", sparse=True),
}


@functools.lru_cache(maxsize=None)
def lowered(name: str) -> ir.Kernel:
    kernel = lower(CASES[name].make(), HOPPER)
    assert kernel.find_plan(AsyncPlan) is not None, f"no asynchronous form: {kernel.notes} {kernel.plans}"
    return kernel


@functools.lru_cache(maxsize=None)
def program(name: str):
    return gluon_program(lowered(name))


def roles(kernel: ir.Kernel) -> list[ir.Role]:
    return [r for s in walk(kernel.body) if isinstance(s, ir.WarpSpecialize) for r in s.roles]


def count(pattern: str, text: str) -> int:
    return len(re.findall(pattern, text))


# ----------------------------------------------------------------------------------------------
# compile-only: TTGIR and PTX


@pytest.mark.parametrize("name", sorted(CASES))
def test_warp_specialized_partitions(name):
    c, kernel, asm = CASES[name], lowered(name), program(name).asm
    ttgir = asm["ttgir"]
    default_warps = 4 * c.consumer_groups
    assert count(r"ttg\.warp_specialize\(", ttgir) == 1
    assert f'"ttg.num-warps" = {default_warps} : i32' in ttgir
    # the producer: one worker partition of one warp at 24 registers
    assert re.findall(r"partition\d+\(.*\) num_warps\((\d+)\)", ttgir) == ["1"]
    assert "requestedRegisters = array<i32: 24>" in ttgir
    assert re.search(r"setmaxnreg\.dec\.sync\.aligned\.u32\s+24;", asm["ptx"])
    # the default partition gets what legalize budgeted for it
    default = next(r for r in roles(kernel) if r.warpgroups == kernel.plan(AsyncPlan).default_role)
    assert default.num_warps == default_warps
    assert re.search(rf"setmaxnreg\.inc\.sync\.aligned\.u32\s+{default.num_regs};", asm["ptx"])
    assert c.consumer_groups != 2 or default.num_regs == 240   # docs/gluon-hopper.md's measurement


@pytest.mark.parametrize("name", sorted(CASES))
def test_wgmma(name):
    c, kernel, asm = CASES[name], lowered(name), program(name).asm
    t = c.dtype
    ttgir, ptx = asm["ttgir"], asm["ptx"]
    # accumulator: M split across the consumer's warp groups, one instruction spans the tile's N
    mma = (f"#ttg.nvidia_mma<{{versionMajor = 3, versionMinor = 0, warpsPerCTA = "
           f"[{4 * c.consumer_groups}, 1], instrShape = [16, {c.bn}, 16]}}>")
    assert mma in ttgir
    assert re.search(r"ttng\.warp_group_dot .*isAsync = true", ttgir)
    shapes = set(re.findall(r"wgmma\.mma_async\.sync\.aligned\.(\w+)\.", ptx))
    assert shapes == {f"m64n{c.bn}k16"}
    # per warp group: (rows / 64) row blocks x (block_K / 16) k steps, once per k iteration
    per_group_rows = c.bm // c.consumer_groups
    want = per_group_rows // 64 * (c.bk // 16)
    assert count(rf"wgmma\.mma_async\.sync\.aligned\.m64n{c.bn}k16\.f32\.{t}\.{t}", ptx) == want
    assert count(r"wgmma\.fence\.sync\.aligned", ptx) >= 1
    for n in {s.outstanding for s in walk(kernel.body) if isinstance(s, ir.GemmWait)}:
        assert re.search(rf"wgmma\.wait_group\.sync\.aligned\s+{n};", ptx)
    if c.transpose_b:
        assert re.search(r"ttg\.memdesc_trans .*order = array<i32: 1, 0>", ttgir)
    assert count(r"\b(ld|st)\.local\b", ptx) == 0, "the kernel spills registers"


@pytest.mark.parametrize("name", sorted(CASES))
def test_tma_and_barriers(name):
    c, asm = CASES[name], program(name).asm
    ttgir, ptx = asm["ttgir"], asm["ptx"]
    item = 2                          # every case is f16 or bf16
    stage_bytes = (c.bm * c.bk + c.bk * c.bn) * item
    barriers = 2 * c.stages           # a full/empty (ready/done) pair per stage
    # TMA: two loads per stage completing on one barrier whose expect carries both tiles' bytes
    assert count(r"ttng\.async_tma_copy_global_to_local", ttgir) == 2
    assert re.findall(r"ttng\.barrier_expect %\w+, (\d+)", ttgir) == [str(stage_bytes)]
    load = r"cp\.async\.bulk\.tensor\.2d\.shared::cluster\.global\.mbarrier::complete_tx::bytes"
    assert count(load, ptx) >= 2
    assert count(r"mbarrier\.arrive\.expect_tx", ptx) >= 1
    # the epilogue: registers -> shared, proxy fence, one TMA store, wait for it
    assert count(r"ttng\.async_tma_copy_local_to_global", ttgir) == 1
    assert count(r"cp\.async\.bulk\.tensor\.2d\.global\.shared::cta\.bulk_group", ptx) >= 1
    assert re.search(r"cp\.async\.bulk\.wait_group\.read\s+0;", ptx)
    assert count(r"fence\.proxy\.async\.shared::cta", ptx) >= 1
    # mbarriers: every one initialized with one arrival per arriving role, waited, arrived on
    assert re.findall(r"ttng\.init_barrier %\w+, (\d+)", ttgir) == ["1"] * barriers
    assert count(r"mbarrier\.init\.shared::cta\.b64", ptx) == barriers
    assert count(r"mbarrier\.inval\.shared::cta\.b64", ptx) == 0   # nothing reuses their bytes
    assert count(r"mbarrier\.try_wait\.parity", ptx) >= 2
    assert count(r"mbarrier\.arrive\.shared::cta\.b64", ptx) >= 1


@pytest.mark.parametrize("name", sorted(CASES))
def test_shared_memory_fits_the_plan(name):
    kernel, p = lowered(name), program(name)
    allocs = [s.buffer for s in walk(kernel.body) if isinstance(s, ir.Alloc)]
    tiles = sum(b.nbytes for b in allocs if b.scope is ir.Scope.SHARED)
    barriers = sum(8 * len(b.arrive_counts) for b in allocs if b.scope is ir.Scope.BARRIER)
    # Triton's own allocation holds every buffer and fits an SM (Triton does not check this at
    # compile time: a kernel over 227 KB fails only at launch); plan_buffers budgeted it
    plan = kernel.plan(SharedMemoryPlan)
    assert tiles + barriers - sum(b for n, _, b in plan.ranges if n in {r for r, _ in plan.reuses}) \
        <= p.metadata["shared"] <= HOPPER.caps.smem_bytes
    assert plan.total_bytes <= HOPPER.caps.smem_bytes


# the TTGIR operations that read or write global memory
GLOBAL_OPS = re.compile(r"\b(tt\.(load|store|atomic_\w+|descriptor_\w+)|ttng\.async_tma_\w+|"
                        r"ttg\.async_copy_global_to_local)\b")


def warp_specialize_regions(ttgir: str) -> tuple[str, list[str]]:
    """(the kernel's TTGIR before its ``ttg.warp_specialize``, the text of each of its regions:
    the default one, then each partition)."""
    head, rest = ttgir.split("ttg.warp_specialize(", 1)
    regions: list[list[str]] = []
    for line in rest.splitlines()[1:]:
        if re.match(r"\s*(default \{|partition\d+\(.*\{)$", line):
            regions.append([])
        elif re.match(r"\s*\} : \(", line):
            break
        elif regions:
            regions[-1].append(line)
    return head[head.index("tt.func public"):], ["\n".join(r) for r in regions]


@pytest.mark.parametrize("name", sorted(CASES))
def test_every_role_waits_for_the_previous_grid_first(name):
    """Programmatic dependent launch (``emit._grid_dependency``): compiled with ``launch_pdl``; in
    the TTGIR each region of the ``warp_specialize`` (one per role) waits for the previous grid
    before any global access, the default one then lets the next grid launch, and what runs
    before (barrier inits) touches no global memory; in the PTX one wait per role, one
    ``launch_dependents``, and no global access reachable from the kernel's start without
    passing a wait (every role's TMA loads and stores, pointer loads and stores)."""
    kernel, p = lowered(name), program(name)
    assert p.metadata["launch_pdl"] is True
    prologue, regions = warp_specialize_regions(p.asm["ttgir"])
    assert not GLOBAL_OPS.search(prologue) and "griddepcontrol" not in prologue
    assert len(regions) == len(roles(kernel))
    for i, region in enumerate(regions):
        events = [line for line in region.splitlines() if "griddepcontrol" in line or GLOBAL_OPS.search(line)]
        assert GRID_WAIT in events[0] and region.count(GRID_WAIT) == 1, events[:3]
        assert any(GLOBAL_OPS.search(e) for e in events)        # the check is not vacuous
        if i == 0:
            assert "griddepcontrol.launch_dependents" in events[1], events[:3]
    ptx = p.asm["ptx"]
    assert count(r"griddepcontrol\.wait;", ptx) == len(roles(kernel))
    assert count(r"griddepcontrol\.launch_dependents;", ptx) == 1
    assert unwaited_global_accesses(ptx) == []


def test_a_global_access_before_the_wait_is_found():
    """The PTX check above is not vacuous: the producer's wait moved after its first TMA load
    leaves that load reachable before any wait (every iteration's path runs it first), while the
    second load, after the wait, is not."""
    first = program("explicit_ws0_ws1")
    lines = first.source.split("\n")
    producer = lines.index(next(line for line in lines if line.startswith("def main_ws0(")))
    wait = lines.index("    gdc_wait()", producer)
    load = next(i for i in range(wait, len(lines)) if "tma.async_copy_global_to_shared(" in lines[i])
    indent = lines[load][:len(lines[load]) - len(lines[load].lstrip())]
    moved = lines[:wait] + lines[wait + 1:load + 1] + [indent + "gdc_wait()"] + lines[load + 1:]
    late = GluonProgram("\n".join(moved), first.kernel, services().store, triton_version())
    assert unwaited_global_accesses(first.asm["ptx"]) == []
    found = unwaited_global_accesses(late.asm["ptx"])
    assert len(found) == 1 and "cp.async.bulk.tensor.2d.shared::cluster.global" in found[0], found


def test_compile_is_cached(monkeypatch):
    first = program("auto_1wg")

    def no_compile(*a, **k):
        raise AssertionError("compiled again although the disk cache holds the result")
    monkeypatch.setattr(gluon_launch, "_run_compile", no_compile)
    again = gluon_program(first.kernel)
    assert again.asm == first.asm


def test_launch_without_gpu_is_a_clear_error():
    if torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0):
        pytest.skip("this machine can launch")
    p = program("auto_1wg")
    a, b, c = (torch.empty(q.static_shape, dtype=q.dtype.torch_dtype) for q in p.kernel.params)
    with pytest.raises(TypeError, match=r"takes 3 argument\(s\)"):
        p.launch([a, b])
    with pytest.raises(ValueError, match="parameter 'A' must be a CUDA tensor, got device cpu"):
        p.launch([a, b, c])
    with pytest.raises(RuntimeError, match="hopper"):
        p.program.launch([a, b, c])   # checked values, but no sm_90 GPU here


# ----------------------------------------------------------------------------------------------
# emitted source


def _line_of(path: Path, text: str) -> int:
    hits = [i for i, line in enumerate(path.read_text().splitlines(), 1) if text in line]
    assert len(hits) == 1
    return hits[0]


def test_source_expect_replaces_the_producer_arrival():
    src = program("auto_1wg").source
    producer = src[src.index("def main_ws0("):src.index("def main(")]
    expect = producer.index("mbarrier.expect(full.index(k % 3), 32768)")
    loads = [m.start() for m in re.finditer(r"tma\.async_copy_global_to_shared\(", producer)]
    assert len(loads) == 2 and expect < min(loads)
    assert "mbarrier.arrive(full" not in src
    assert re.search(r"mbarrier\.wait\(empty\.index\(k % 3\), \(\(k // 3\) & 1\) \^ 1\)", producer)


def test_source_host_part_and_locations():
    src = program("explicit_merged_bm128").source
    assert "_tilews_descriptor(A, [128, 64], A_s_layout.value)" in src
    # B_s has A_s's layout (128-byte swizzle, 16 bits): one constant serves both
    assert "_tilews_descriptor(B, [64, 128], A_s_layout.value)" in src
    assert "B_s_layout" not in src and src.count("A_s_layout: gl.constexpr") == 1
    assert re.search(r"_tilews_descriptor\(C, \[128, 128\], \w+_layout\.value\)", src)
    assert "def main_grid():\n    return (4, 2)" in src
    assert "gl.warp_specialize([(main_ws1_2, args), (main_ws0, args)], [1], [24])" in src
    gemm_line = _line_of(EXAMPLES / "ws_gemm.py", "T.gemm(A_s, B_s, C_f)")
    lines = src.splitlines()
    mma = next(i for i, line in enumerate(lines) if "warpgroup_mma(" in line)
    assert lines[mma - 1].strip() == f"# tilews: ws_gemm.py:{gemm_line}"
    # every statement of a role is preceded by its origin comment
    for i, line in enumerate(lines):
        if "mbarrier.wait(" in line or "warpgroup_mma(" in line or "tma.async_copy" in line:
            assert lines[i - 1].strip().startswith("# tilews: ws_gemm.py:"), line


def test_emit_refuses_a_kernel_not_legalized_for_gluon():
    kernel = lower(CASES["auto_1wg"].make(), TRITON_CPU)
    with pytest.raises(InternalError, match="kernel 'main' has no AsyncPlan"):
        emit(kernel)


def test_emit_names_a_statement_without_a_rule():
    kernel = lowered("auto_1wg")
    ws = next(s for s in kernel.body.stmts if isinstance(s, ir.WarpSpecialize))
    x = next(s.buffer for s in walk(kernel.body) if isinstance(s, ir.Alloc) and s.buffer.name == "C_f")

    def with_consumer_stmt(stmt):
        consumer = dataclasses.replace(ws.roles[1], body=ir.Seq(ws.roles[1].body.stmts + (stmt,)))
        new_ws = dataclasses.replace(ws, roles=(ws.roles[0], consumer))
        body = tuple(new_ws if s is ws else s for s in kernel.body.stmts)
        return dataclasses.replace(kernel, body=ir.Seq(body))

    with pytest.raises(InternalError, match="no rule for BlockSync"):
        emit(with_consumer_stmt(ir.BlockSync(loc=ws.loc)))
    # a store is spelled only for the scalar locals legalize recorded
    with pytest.raises(InternalError, match="'C_f' is not a scalar local"):
        emit(with_consumer_stmt(ir.Store(x, (ir.const(0), ir.const(0)), ir.const(1.0), ws.loc)))


# ----------------------------------------------------------------------------------------------
# GPU (sm_90 only)


_TORCH = {"f16": torch.float16, "bf16": torch.bfloat16}


@pytest.mark.gpu
@pytest.mark.skipif(not (torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)),
                    reason="needs an sm_90 GPU")
@pytest.mark.parametrize("name", sorted(CASES))
def test_numerics_on_gpu(name):
    c = CASES[name]
    a = randn(c.M, c.K, dtype=_TORCH[c.dtype], device="cuda")
    b = randn(*((c.N, c.K) if c.transpose_b else (c.K, c.N)), dtype=_TORCH[c.dtype], device="cuda")
    out = torch.full((c.M, c.N), float("nan"), dtype=_TORCH[c.dtype], device="cuda")
    mask = block_mask(c.M // c.bm, c.K // c.bk, seed=0) if c.sparse else None
    program(name).launch([a, b, *([mask.cuda()] if c.sparse else []), out, *c.scalars])
    torch.cuda.synchronize()
    kept = a.double() * expand(mask, c.bm, c.bk).cuda() if c.sparse else a.double()
    ref = kept @ (b.double().T if c.transpose_b else b.double())
    assert rel_err(out, ref) < 1e-2


def block_mask(rows: int, cols: int, seed: int) -> torch.Tensor:
    """A random ~50% block mask (int32) whose second row block keeps no K tile."""
    g = torch.Generator().manual_seed(seed)
    mask = (torch.rand(rows, cols, generator=g) < 0.5).to(torch.int32)
    mask[1 % rows] = 0
    return mask


def expand(mask: torch.Tensor, bm: int, bk: int) -> torch.Tensor:
    """The element mask (float64) of a block mask with bm x bk blocks."""
    return mask.repeat_interleave(bm, dim=0).repeat_interleave(bk, dim=1).to(torch.float64)


def test_scalar_parameter_is_a_runtime_argument():
    p = program("explicit_ws0_ws1")
    assert "def main(A_desc_0, B_desc_0, C_desc_0, tiles):" in p.source
    assert "for ko in range(0, tiles, 1):" in p.source
    assert "def main_args(A, B, C, tiles):" in p.source and "def main_grid(tiles):" in p.source
    assert re.search(r"%tiles: i32", p.asm["ttgir"])


def test_a_failing_triton_compile_is_an_internal_error():
    kernel = lowered("auto_1wg")
    good = program("auto_1wg").source
    bad = good.replace("instr_shape=[16, 128, 16]", "instr_shape=[16, 120, 16]")
    assert bad != good
    with pytest.raises(InternalError, match="for sm_90a failed") as e:
        GluonProgram(bad, kernel, services().store, triton_version())
    assert e.value.notes, "the compiler's message is attached"


# ----------------------------------------------------------------------------------------------
# block-sparse (docs/ws-semantics.md #8): guarded iterations, scalar loads, loop-carried counters


def then_regions(ttgir: str) -> list[str]:
    """The text of each ``scf.if``'s then-region (brace-matched)."""
    out = []
    for m in re.finditer(r"scf\.if [^{]*\{", ttgir):
        depth, i = 1, m.end()
        while depth:
            depth += {"{": 1, "}": -1}.get(ttgir[i], 0)
            i += 1
        out.append(ttgir[m.end():i])
    return out


def test_block_sparse_keeps_the_guard_and_counts_the_iterations_that_ran():
    kernel, p = lowered("block_sparse"), program("block_sparse")
    assert kernel.find_plan(AsyncPlan) is not None
    assert dict(kernel.plan(AsyncPlan).scalar_locals) == {"produced": True, "consumed": True}
    assert kernel.plan(AsyncPlan).pointer_params == (("BlockMask", ((0,), (1, 2))),)
    ttgir = p.asm["ttgir"]
    assert count(r"ttg\.warp_specialize\(", ttgir) == 1
    # each role reads its mask element (a scalar load from the pointer parameter) ...
    assert count(r"tt\.load %\w+, %\w+, %\w+ : !tt\.ptr<i32>", ttgir) == 2
    # ... and runs its TMA loads / wgmma only under it
    guarded = then_regions(ttgir)
    assert sum("ttng.async_tma_copy_global_to_local" in r for r in guarded) == 1
    assert sum(count(r"ttng\.async_tma_copy_global_to_local", r) for r in guarded) == 2
    assert sum("ttng.warp_group_dot " in r for r in guarded) == 1
    assert count(r"ttng\.async_tma_copy_global_to_local", ttgir) == 2
    assert count(r"ttng\.warp_group_dot ", ttgir) == 1
    # the counters are loop-carried from 0, and each guard yields its role's counter
    for name in ("produced", "consumed"):
        assert re.search(rf"scf\.for %k = .* iter_args\([^)]*%{name}\w* = %c0_i32\w*[,)]", ttgir), name
    assert count(r"= scf\.if %\w+ -> \((?:[^)]*, )?i32(?:, [^)]*)?\)", ttgir) == 2
    src = p.source
    for role, name in (("main_ws0", "produced"), ("main_ws1_2", "consumed")):
        body = src[src.index(f"def {role}("):]
        assert body.index(f"    {name} = 0\n") < body.index("for k in range(0, 8, 1):")
        assert f"{name} = {name} + 1" in body
        assert re.search(r"BlockMask, BlockMask_stride0, BlockMask_stride1\):", body.splitlines()[0])
        assert "mbarrier.wait(" in body and f".index({name} % 3)" in body
    assert "BlockMask, *BlockMask.stride()," in src


def test_pointer_parameters_go_only_to_the_roles_that_read_them():
    # the consumer's guard made constant: only the producer reads BlockMask
    base = lower(CASES["block_sparse"].make(), HOPPER, upto="legalize")
    consumer = next(r for s in walk(base.body) if isinstance(s, ir.WarpSpecialize) for r in s.roles
                    if r.warpgroups == (1, 2))
    guard = next(s for s in walk(consumer.body) if isinstance(s, ir.If))
    kernel = legalize_wgmma.run(transform(base, lambda n: dataclasses.replace(n, cond=ir.const(True))
                                          if n is guard else None), HOPPER)
    assert kernel.plan(AsyncPlan).pointer_params == (("BlockMask", ((0,),)),)
    src = emit(kernel)
    shared = "A_desc_0, B_desc_0, C_desc_0, A_s, B_s, C_f_stage0, full, empty"
    assert f"def main_ws1_2({shared}):" in src
    assert f"def main_ws0({shared}, BlockMask, BlockMask_stride0, BlockMask_stride1):" in src
    assert f"main_ws0_args = ({shared}, BlockMask, BlockMask_stride0, BlockMask_stride1)" in src
    assert "gl.warp_specialize([(main_ws1_2, args), (main_ws0, main_ws0_args)], [1], [24])" in src
    ttgir = GluonProgram(src, kernel, services().store, triton_version()).asm["ttgir"]
    assert count(r"tt\.load %\w+, %\w+, %\w+ : !tt\.ptr<i32>", ttgir) == 1


def _refusal(kernel: ir.Kernel) -> str:
    out = legalize_wgmma.run(kernel, HOPPER)
    return out.plan(AsyncRefusal).reason


def test_legalize_refuses_scalar_accesses_gluon_cannot_spell():
    base = lower(CASES["block_sparse"].make(), HOPPER, upto="legalize")
    assert legalize_wgmma.run(base, HOPPER).find_plan(AsyncPlan) is not None
    # a counter whose role does not define it at its top level before the loop
    undefined = transform(base, lambda n: dataclasses.replace(n, body=ir.Seq(tuple(
        s for s in n.body.stmts if not isinstance(s, ir.Store)), n.body.loc))
        if isinstance(n, ir.Role) else None)
    assert "before a store in its scope (or an enclosing one) defines it" in _refusal(undefined)
    # a local buffer that is not a scalar
    wide = transform(base, lambda n: dataclasses.replace(n, shape=(ir.const(2),))
                     if isinstance(n, ir.Buffer) and n.name == "produced" else None)
    assert "local buffer 'produced' (i32[2]) is not an i32 or f32 scalar" in _refusal(wide)
    # an element read of shared memory in the guard
    a_s = next(s.buffer for s in walk(base.body) if isinstance(s, ir.Alloc) and s.buffer.name == "A_s")
    on_chip = transform(base, lambda n: ir.Load(a_s, (ir.const(0),) * 3, n.loc)
                        if isinstance(n, ir.Load) and n.buffer.name == "BlockMask" else None)
    assert "an element read of shared buffer 'A_s'" in _refusal(on_chip)


@pytest.mark.parametrize("D", [64, 128])
def test_two_consumers_with_private_buffers_compile(D):
    """ws(0) + ws(1) + ws(2): two consumer partitions, each with its own accumulator and its own
    shared staging buffer P (docs/ws-semantics.md #4); Triton's allocation of the buffers of concurrently
    running partitions is checked disjoint by the TTGIR verifier during this compile."""
    from .test_ws_oracle import two_consumers
    prim, (M, K, N) = two_consumers(D)
    kernel = lower(build_kernel(prim), HOPPER)
    assert kernel.find_plan(AsyncPlan) is not None
    prog = gluon_program(kernel)
    ttgir, ptx = prog.asm["ttgir"], prog.asm["ptx"]
    assert ttgir.count("ttg.warp_specialize") == 1
    assert sorted(int(w) for w in re.findall(r"num_warps\((\d+)\)", ttgir)) == [1, 4]
    assert "requestedRegisters = array<i32: 24, 232>" in ttgir
    assert len(re.findall(rf"wgmma\.mma_async\.sync\.aligned\.m64n{D}k16\.f32\.f16\.f16", ptx)) >= 2
    assert ptx.count("cp.async.bulk.tensor") >= 5          # 3 loads + 2 stores
    assert "fence.proxy.async" in ptx


def test_pingpong_consumers_compile():
    """Persistent ping-pong: producer (1 warp), consumer T.ws(1) as the default partition and
    T.ws(2) as a 4-warp worker holding its own wgmma accumulator; `turn` barriers order them."""
    from examples.ws_gemm import pingpong_matmul_program
    kernel = lower(build_kernel(pingpong_matmul_program(1024, 1024, 512, num_sms=4)), HOPPER)
    assert kernel.find_plan(AsyncPlan) is not None
    prog = gluon_program(kernel)
    ttgir, ptx = prog.asm["ttgir"], prog.asm["ptx"]
    assert sorted(int(w) for w in re.findall(r"num_warps\((\d+)\)", ttgir)) == [1, 4]
    assert re.findall(r"wgmma\.mma_async\.sync\.aligned\.(m\d+n\d+k\d+)", ptx) and \
        set(re.findall(r"wgmma\.mma_async\.sync\.aligned\.(m\d+n\d+k\d+)", ptx)) == {"m64n128k16"}
    assert "turn" in prog.source and prog.source.count("mbarrier.wait(turn") == 2
    assert dict(kernel.plan(AsyncPlan).barrier_counts)["turn"] == (1, 1)


def test_persistent_gemm_compile():
    """T.Persistent GEMM: one warp_specialize whose partitions each loop over the block's tiles
    (an outer scf.for around the k loop), the TMA store inside the consumer's tile loop."""
    from examples.gemm import persistent_matmul
    kernel = lower(build_kernel(persistent_matmul.fn(1024, 1024, 512, num_sms=3)), HOPPER)
    assert kernel.find_plan(AsyncPlan) is not None and [ir.as_int(g) for g in kernel.grid] == [3]
    prog = gluon_program(kernel)
    ttgir = prog.asm["ttgir"]
    assert ttgir.count("ttg.warp_specialize") == 1
    default = ttgir[ttgir.index("ttg.warp_specialize"):ttgir.index("partition0(")]
    assert default.count("scf.for") >= 2                      # tile loop around the k loop
    tile_loop = default[default.index("scf.for"):]
    assert "async_tma_copy_local_to_global" in tile_loop       # the store happens per tile
    assert set(re.findall(r"wgmma\.mma_async\.sync\.aligned\.(m\d+n\d+k\d+)", prog.asm["ptx"])) == {"m64n256k16"}


def _store_into_3d(M, N, K, S, bm=64, bn=64, bk=64):
    @T.prim_func
    def main(A: T.Tensor((M, K), T.bfloat16), B: T.Tensor((K, N), T.bfloat16),
             W: T.Tensor((M, S, N), T.float32)):
        with T.Kernel(T.ceildiv(N, bn), T.ceildiv(M, bm), threads=128) as (bx, by):
            A_s = T.alloc_shared((bm, bk), T.bfloat16)
            B_s = T.alloc_shared((bk, bn), T.bfloat16)
            C_f = T.alloc_fragment((bm, bn), T.float32)
            T.clear(C_f)
            for k in T.Pipelined(T.ceildiv(K, bk), num_stages=3):
                T.copy(A[by * bm, k * bk], A_s)
                T.copy(B[k * bk, bx * bn], B_s)
                T.gemm(A_s, B_s, C_f)
            T.copy(C_f, W[by * bm:(by + 1) * bm, 1, bx * bn:(bx + 1) * bn])
    return main


def test_a_2d_tile_stored_across_a_unit_middle_dim_is_a_bulk_copy():
    """A 2-d tile stored into W[m0:m1, s, n0:n1] (a unit dim between the tile's dims) is a TMA
    store through a 3-d descriptor whose box has a unit middle dim (checked right on an H100 by
    tests/gpu/test_hopper_gpu.py); the triton.language form computes the same (Triton's CPU
    interpreter). (The start-index form W[m, s, n] would place the tile on the last two dims,
    as in TileLang.)"""
    k = tilews.jit(target="hopper")(_store_into_3d)(128, 128, 128, 2)
    assert k.report.target == "hopper"
    assert "[1, 64, 64]" not in k.get_kernel_source()
    a = torch.randn(128, 128).to(torch.bfloat16)
    b = torch.randn(128, 128).to(torch.bfloat16)
    w = torch.full((128, 2, 128), float("nan"))
    tilews.jit(target="triton")(_store_into_3d)(128, 128, 128, 2)(a, b, w)
    assert torch.allclose(w[:, 1], a.float() @ b.float(), rtol=1e-3, atol=1e-3)
    assert w[:, 0].isnan().all()


@T.macro
def _pipelined_gemm(A, B, A_s, B_s, C_f, bx, by):
    """C_f = the (by, bx) tile of A @ B, through the shared tiles A_s and B_s, two stages."""
    bm, bk = A_s.shape
    bn = B_s.shape[1]
    T.clear(C_f)
    for k in T.Pipelined(A.shape[1] // bk, num_stages=2):
        T.copy(A[by * bm, k * bk], A_s)
        T.copy(B[k * bk, bx * bn], B_s)
        T.gemm(A_s, B_s, C_f)


def test_a_stored_broadcast_adds_no_zero():
    """A ``T.Parallel`` store whose value misses a loop index is spelled as a splat (a scalar) or
    ``gl.broadcast`` (a vector along one axis), not ``gl.full(0) + value``: 0.0 + x is no
    identity (-0.0), so that add stayed an FADD per element in SASS, and for a loaded block scale
    ptxas routed the value through a uniform register, waiting on the load between wgmma issues."""
    M = N = K = 256
    bm, bn, bk = 128, 128, 64

    @T.prim_func
    def main(A: T.Tensor((M, K), T.float16), B: T.Tensor((K, N), T.float16),
             bias: T.Tensor((N,), T.float32), s: T.Tensor((1,), T.float32),
             C: T.Tensor((M, N), T.float16)):
        with T.Kernel(N // bn, M // bm, threads=128) as (bx, by):
            A_s = T.alloc_shared((bm, bk), T.float16)
            B_s = T.alloc_shared((bk, bn), T.float16)
            C_f = T.alloc_fragment((bm, bn), T.float32)
            D_f = T.alloc_fragment((bm, bn), T.float32)
            E_f = T.alloc_fragment((bm, bn), T.float32)
            _pipelined_gemm(A, B, A_s, B_s, C_f, bx, by)
            for i, j in T.Parallel(bm, bn):
                D_f[i, j] = bias[bx * bn + j]           # a vector along j, broadcast over i
            for i, j in T.Parallel(bm, bn):
                E_f[i, j] = s[0]                        # a scalar, splat
            for i, j in T.Parallel(bm, bn):
                C_f[i, j] = C_f[i, j] * E_f[i, j] + D_f[i, j]
            T.copy(C_f, C[by * bm, bx * bn])

    kernel = lower(build_kernel(main), HOPPER)
    assert kernel.find_plan(AsyncPlan) is not None
    src = emit(kernel)
    assert re.search(r"D_f = gl\.broadcast\(.*gl\.load\(bias", src), src
    assert re.search(r"E_f = gl\.full\(\[\d+, \d+\], gl\.load\(s", src), src
    assert not re.search(r"gl\.full\([^)]*\) \+", src), src
    ptx = gluon_program(kernel).asm["ptx"]
    assert not re.search(r"add(\.rn)?\.f32\s+%r\d+, %r\d+, 0f00000000;", ptx)


def _float_divmod_epilogue(M, N, K, bm=64, bn=64, bk=64):
    """A pipelined GEMM whose epilogue takes the float ``%`` and ``//`` of the accumulator by a
    per-column divisor (the numeric contract, docs/design.md §3)."""
    @T.prim_func
    def main(A: T.Tensor((M, K), T.float16), B: T.Tensor((K, N), T.float16),
             Z: T.Tensor((N,), T.float32), R: T.Tensor((M, N), T.float32),
             Q: T.Tensor((M, N), T.float32)):
        with T.Kernel(N // bn, M // bm, threads=128) as (bx, by):
            A_s = T.alloc_shared((bm, bk), T.float16)
            B_s = T.alloc_shared((bk, bn), T.float16)
            C_f = T.alloc_fragment((bm, bn), T.float32)
            R_f = T.alloc_fragment((bm, bn), T.float32)
            _pipelined_gemm(A, B, A_s, B_s, C_f, bx, by)
            for i, j in T.Parallel(bm, bn):
                R_f[i, j] = C_f[i, j] % Z[bx * bn + j]
                C_f[i, j] = C_f[i, j] // Z[bx * bn + j]
            T.copy(R_f, R[by * bm, bx * bn])
            T.copy(C_f, Q[by * bm, bx * bn])
    return build_kernel(main)


def half_epilogue(dtype, M=128, N=128, K=64, bm=64, bn=64, bk=64):
    """A pipelined GEMM whose epilogue computes in 16-bit ``dtype``: a remainder stored as float32,
    a floor division, a quotient used by a product, and ``T.max`` with a constant and ``T.min``
    used by further operations; each must round to ``dtype`` (docs/design.md's numeric contract),
    where Triton computes ``/``, ``%`` and these min/max in float32. No product feeds a sum, which
    the GPU compiler would fuse into one FMA (rounded once)."""
    @T.prim_func
    def main(A: T.Tensor((M, K), T.float16), B: T.Tensor((K, N), T.float16),
             Z: T.Tensor((N,), dtype), R: T.Tensor((M, N), T.float32), Q: T.Tensor((M, N), dtype),
             D: T.Tensor((M, N), dtype), X: T.Tensor((M, N), dtype)):
        with T.Kernel(N // bn, M // bm, threads=128) as (bx, by):
            A_s = T.alloc_shared((bm, bk), T.float16)
            B_s = T.alloc_shared((bk, bn), T.float16)
            C_f = T.alloc_fragment((bm, bn), T.float32)
            H_f = T.alloc_fragment((bm, bn), dtype)
            R_f = T.alloc_fragment((bm, bn), T.float32)
            Q_f = T.alloc_fragment((bm, bn), dtype)
            D_f = T.alloc_fragment((bm, bn), dtype)
            _pipelined_gemm(A, B, A_s, B_s, C_f, bx, by)
            for i, j in T.Parallel(bm, bn):
                H_f[i, j] = T.cast(C_f[i, j] * 0.37, dtype)
            for i, j in T.Parallel(bm, bn):
                R_f[i, j] = H_f[i, j] % Z[bx * bn + j]
                Q_f[i, j] = H_f[i, j] // Z[bx * bn + j]
                D_f[i, j] = H_f[i, j] / Z[bx * bn + j] * H_f[i, j]
                H_f[i, j] = (T.max(H_f[i, j], 0.1) + Z[bx * bn + j]) * T.min(H_f[i, j], Z[bx * bn + j])
            T.copy(R_f, R[by * bm, bx * bn])
            T.copy(Q_f, Q[by * bm, bx * bn])
            T.copy(D_f, D[by * bm, bx * bn])
            T.copy(H_f, X[by * bm, bx * bn])
    return main


def half_epilogue_inputs(dtype: torch.dtype, M=128, N=128, K=64, seed=3):
    """A and B of small integers (the GEMM exact in any order), divisors of both signs away from
    zero."""
    g = torch.Generator().manual_seed(seed)
    a = torch.randint(-3, 4, (M, K), generator=g).half()
    b = torch.randint(-3, 4, (K, N), generator=g).half()
    z = (torch.rand(N, generator=g) * 2 + 0.5) * (torch.randint(0, 2, (N,), generator=g) * 2 - 1)
    return a, b, z.to(dtype)


@pytest.mark.parametrize("dtype", [T.float16, T.bfloat16])
def test_16bit_arithmetic_rounds_to_its_type_on_hopper(dtype):
    """Triton computes ``/`` and ``%`` of 16-bit floats, a bfloat16's min/max and a 16-bit min/max
    with a Python number in float32; each result is truncated to its type before anything uses
    it (a remainder stored as float32 too), and ``//`` floors the truncated quotient. Before: the
    remainder and the floor's quotient stayed float32, the max/min made the rest of the
    expression float32 (not rounded at each step), and a quotient stored into a 16-bit fragment
    did not compile."""
    kernel = lower(build_kernel(half_epilogue(dtype)), HOPPER)
    assert kernel.find_plan(AsyncPlan) is not None
    asm = gluon_program(kernel).asm
    ttgir, half = asm["ttgir"], {T.float16: "f16", T.bfloat16: "bf16"}[dtype]

    def truncated(value: str) -> str:    # the 16-bit value ``value`` (an f32 SSA name) rounds to
        found = re.search(rf"(%\w+) = arith\.truncf {value} : tensor<64x64xf32, #\w+> to "
                          rf"tensor<64x64x{half}", ttgir)
        assert found, f"{value} is not truncated to {half}\n{ttgir}"
        return found.group(1)

    # %: the corrected remainder (select of r + z and r), truncated, then widened for R
    rem = re.search(r"(%\w+) = arith\.remf ", ttgir).group(1)
    select = re.search(rf"(%\w+) = arith\.select %\w+, %\w+, {rem} ", ttgir).group(1)
    assert re.search(rf"= arith\.extf {truncated(select)} ", ttgir)
    # //: the floor of a truncated quotient; /: a truncated quotient multiplied in 16 bits; both
    # an IEEE-rounded float32 division (not div.full.f32, up to 2 ulp off: its rounding to 16 bits
    # could differ)
    quotients = [truncated(q) for q in re.findall(r"(%\w+) = tt\.precise_divf ", ttgir)]
    floored = re.search(r"= math\.floor (%\w+) ", ttgir).group(1)
    assert any(re.search(rf"{floored} = arith\.extf {q} ", ttgir) for q in quotients), ttgir
    assert any(re.search(rf"= arith\.mulf {q}, %\w+ : tensor<64x64x{half}", ttgir) for q in quotients)
    assert "div.full.f32" not in asm["ptx"]
    # max with a constant (and a bfloat16's min): truncated, the rest computed in 16 bits
    widened = re.findall(r"(%\w+) = arith\.m(?:ax|in)numf %\w+, %\w+ : tensor<64x64xf32", ttgir)
    assert len(widened) == (2 if half == "bf16" else 1), ttgir
    for value in widened:
        assert re.search(rf"= arith\.(add|mul)f [^:]*{truncated(value)}\b[^:]*: tensor<64x64x{half}", ttgir)
    # the lowered program on the interpreter: the remainder is Python's, in the 16-bit type
    tdt = {T.float16: torch.float16, T.bfloat16: torch.bfloat16}[dtype]
    a, b, z = half_epilogue_inputs(tdt)
    outs = [poisoned(128, 128)] + [poisoned(128, 128, dtype=tdt) for _ in range(3)]
    interpreter.run(kernel, [a, b, z, *outs])
    h = ((a.float() @ b.float()) * 0.37).to(tdt).double()
    r = torch.remainder(h, z.double()).to(tdt)
    assert torch.equal(outs[0], r.float()) and not torch.equal(r.float().double(), torch.remainder(h, z.double()))


def test_float_mod_and_floordiv_spell_floor_semantics_on_hopper():
    """Float ``%`` is the remainder (``arith.remf``) plus the divisor where their signs differ;
    float ``//`` the floor of the IEEE-rounded quotient. Before: ``//`` divided with Triton's
    ``/``, ``div.full.f32`` (up to 2 ulp off), so a quotient just below an integer could floor one
    lower than Python's. The lowered program on the interpreter gives Python's numbers."""
    M = N = K = 64
    kernel = lower(_float_divmod_epilogue(M, N, K), HOPPER)
    assert kernel.find_plan(AsyncPlan) is not None
    asm = gluon_program(kernel).asm
    ttgir, ptx = asm["ttgir"], asm["ptx"]
    # %: r = remf(c, z); where(r != 0 and (r < 0) != (z < 0), r + z, r)
    rem = re.search(r"(%\w+) = arith\.remf (%\w+), (%\w+) ", ttgir)
    assert rem, ttgir
    r, z = rem.group(1), rem.group(3)
    assert re.search(rf"= arith\.cmpf une, {r}, ", ttgir) and re.search(rf"= arith\.cmpf olt, {r}, ", ttgir)
    assert re.search(rf"(%\w+) = arith\.addf {r}, {z} ", ttgir)
    assert re.search(rf"= arith\.select %\w+, %\w+, {r} ", ttgir)
    # //: floor(div_rn(c, z)): an IEEE-rounded division, floored (cvt.rmi: round toward -inf)
    quotient = re.search(r"(%\w+) = tt\.precise_divf %\w+, %\w+ ", ttgir)
    assert quotient and re.search(rf"= math\.floor {quotient.group(1)} ", ttgir), ttgir
    assert "div.full.f32" not in ptx and "div.rn.f32" in ptx
    assert re.search(r"cvt\.rmi(\.ftz)?\.f32\.f32", ptx)
    # numbers: integer GEMM results (exact in float32) by dyadic divisors of both signs, so the
    # remainder and the floor are exact in float64 too
    g = torch.Generator().manual_seed(7)
    a = torch.randint(-3, 4, (M, K), generator=g).half()
    b = torch.randint(-3, 4, (K, N), generator=g).half()
    z = torch.tensor([-2.5, -1.5, -0.75, 0.75, 1.5, 2.5, 3.25, -3.25])[torch.randint(0, 8, (N,), generator=g)]
    r_out, q_out = torch.full((M, N), float("nan")), torch.full((M, N), float("nan"))
    interpreter.run(kernel, [a, b, z, r_out, q_out])
    c = a.double() @ b.double()
    assert (c.abs() > 3).float().mean() > 0.5          # not a trivial product
    torch.testing.assert_close(r_out.double(), torch.remainder(c, z.double()), rtol=0, atol=0)
    torch.testing.assert_close(q_out.double(), torch.floor(c / z.double()), rtol=0, atol=0)
    assert ((r_out < 0) == (z < 0)).logical_or(r_out == 0).all()
