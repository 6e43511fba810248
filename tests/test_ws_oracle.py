"""The interpreter as the oracle of the warp-specialization rewrite: for every WS program, the
program before the passes equals the program after them (Hopper pipeline) under many random
schedules; and each failure mode of docs/ws-semantics.md #2, #4, #5, #6 is caught in a deliberately wrong
lowering (kept here) while ours passes."""
from __future__ import annotations

import dataclasses

import pytest
import torch

import tilews.language as T
from examples.gemm import matmul
from examples.ws_gemm import ws_matmul_program, ws_ring_matmul_program
from tilews import CompileError
from tilews.lowering import interpreter, ir, layouts, verify_async
from tilews.lowering.errors import DeadlockError, RaceError, UninitializedReadError
from tilews.lowering.frontend import build_kernel
from tilews.lowering.passes import overlap_mma
from tilews.lowering.pipeline import lower
from tilews.lowering.plans import AsyncPlan, LayoutPlan, SharedMemoryPlan
from tilews.triton_ext.gluon.backend import HOPPER
from tilews.lowering.traverse import transform, walk

from .helpers import poisoned, randn

SEEDS = range(20)
AS_WRITTEN_K = dataclasses.replace(HOPPER, pipeline=HOPPER.pipeline.without("coarsen_handshakes"))
"""Hopper without coarsen_handshakes: an explicit loop keeps its own k tiles, so the lowered
program adds the same float32 products in the same order as the program as written (coarsening
sums two k tiles per gemm: equal up to rounding, tests/passes/test_coarsen_handshakes.py)."""


def run_interp(kernel, args, out_index, seed=0):
    args = list(args)
    args[out_index] = poisoned(*args[out_index].shape, dtype=args[out_index].dtype)
    interpreter.run(kernel, args, seed=seed)
    return args[out_index]


def assert_same_under_schedules(prim, args, out_index, seeds=SEEDS, target=HOPPER):
    """``prim``: a ``@T.prim_func`` kernel, or the frontend IR of one (``Kernel.ir_before``)."""
    before = prim if isinstance(prim, ir.Kernel) else build_kernel(prim)
    after = lower(before, target)
    assert any(isinstance(s, ir.WarpSpecialize) for s in walk(after.body))
    want = run_interp(before, args, out_index)
    for seed in seeds:
        got = run_interp(after, args, out_index, seed)
        assert torch.equal(got, want), f"seed {seed}: after passes differs from before"
    return after


# ----------------------------------------------------------------------------------------------
# before == after


@pytest.mark.parametrize("num_stages", [1, 2, 3, 4])
@pytest.mark.parametrize("K", [96, 100])          # 100: K not a multiple of block_K (and no TMA)
def test_auto_ws_gemm(num_stages, K):
    M, N = 96, 80
    prim = matmul.fn(M, N, K, block_M=64, block_N=32, block_K=32, num_stages=num_stages)
    a, b = randn(M, K, dtype=torch.float16, seed=1), randn(K, N, dtype=torch.float16, seed=2)
    after = assert_same_under_schedules(prim, [a, b, torch.empty(M, N, dtype=torch.float16)], 2)
    assert after.threads == 256
    assert (after.find_plan(AsyncPlan) is not None) == (K == 96)


@pytest.mark.parametrize("num_stages", [1, 3])
@pytest.mark.parametrize("N", [80, 81])
def test_register_staged_producer_copies(num_stages, N):
    # K = 100 fp16: A's rows are 200 bytes, not TMA's; with register copies (tl.enable_lower_ldgstg)
    # the producer loads A through its registers (masked: the last k tile is half past K), B
    # by TMA (N = 80) or through registers too (N = 81: rows of 162 bytes, and C's tiles are
    # then stored from registers), and the program stays warp-specialized
    M, K = 96, 100
    prim = matmul.fn(M, N, K, block_M=64, block_N=32, block_K=32, num_stages=num_stages)
    a, b = randn(M, K, dtype=torch.float16, seed=3), randn(K, N, dtype=torch.float16, seed=4)
    target = HOPPER.replace(register_copies=True)
    after = assert_same_under_schedules(prim, [a, b, torch.empty(M, N, dtype=torch.float16)], 2,
                                        target=target)
    plan = after.plan(AsyncPlan)
    aligned = N == 80
    assert plan.tma_buffers == ({"B", "C"} if aligned else set())
    assert [name for name, _, _ in plan.register_loads] == (["A_s"] if aligned else ["A_s", "B_s"])
    producer = next(r for s in walk(after.body) if isinstance(s, ir.WarpSpecialize)
                    for r in s.roles if r.warpgroups == (0,))
    assert producer.num_warps == 4
    stmts = [s for s in walk(producer.body) if isinstance(s, (ir.Copy, ir.ProxyFence, ir.BarrierArrive))]
    kinds = [type(s).__name__ + (f" {s.mechanism.value}" if isinstance(s, ir.Copy) else "") for s in stmts]
    # the staged copies first, fenced, then the TMA one (its expect after the fence); all
    # staged: the fence before the arrival
    want = (["Copy masked", "ProxyFence", "Copy tma", "BarrierArrive"] if aligned
            else ["Copy masked", "Copy masked", "ProxyFence", "BarrierArrive"])
    assert kinds == want, kinds


@pytest.mark.parametrize("block_M", [128, 256])
def test_explicit_merged_consumer_gemm(block_M):
    M, N, K = block_M + 64, 96, 160
    prim = ws_matmul_program(M, N, K, block_M=block_M, block_N=32, block_K=32)
    a, b = randn(M, K, dtype=torch.float16, seed=3), randn(K, N, dtype=torch.float16, seed=4)
    after = assert_same_under_schedules(prim, [a, b, torch.empty(M, N, dtype=torch.float16)], 2)
    assert after.find_plan(AsyncPlan) is not None
    consumer = next(r for s in walk(after.body) if isinstance(s, ir.WarpSpecialize)
                    for r in s.roles if r.warpgroups == (1, 2))
    assert consumer.num_warps == 8
    acc = after.plan(LayoutPlan).of("C_f")
    assert acc.warps_per_cta == (8, 1)          # M split across the two warp groups


@pytest.mark.parametrize("stages", [1, 2, 3])
def test_explicit_ring_gemm(stages):
    M, N, K = 256, 64, 224                       # K / block_K = 7 tiles: the ring wraps
    prim = ws_ring_matmul_program(M, N, K, block_M=128, block_N=64, block_K=32, stages=stages,
                                  dtype=T.float16)
    a, b = randn(M, K, dtype=torch.float16, seed=13), randn(K, N, dtype=torch.float16, seed=14)
    after = assert_same_under_schedules(prim, [a, b, torch.empty(M, N, dtype=torch.float16)], 2)
    assert after.find_plan(AsyncPlan) is not None
    waits = [s.outstanding for s in walk(after.body) if isinstance(s, ir.GemmWait)]
    # kept in flight only where the deferred release still leaves the producer a stage of lead
    assert waits == ([0] if stages < overlap_mma.MIN_STAGES else [1, 0])


def two_consumers(D, aliased=False):
    """Producer ws(0) loads A; consumers ws(1) and ws(2) each multiply by their own B half and
    stage their result through a private shared buffer P (D columns)."""
    M, K, N = 64, 64, 2 * D

    @T.prim_func
    def main(A: T.Tensor((M, K), T.float16), B: T.Tensor((K, N), T.float16), C: T.Tensor((M, N), T.float16)):
        with T.Kernel(1, threads=384) as bx:
            A_s = T.alloc_shared((M, K), T.float16)
            B1 = T.alloc_shared((K, D), T.float16)
            B2 = T.alloc_shared((K, D), T.float16)
            P1 = T.alloc_shared((M, D), T.float16)
            P2 = T.alloc_shared((M, D), T.float16)
            acc1 = T.alloc_fragment((M, D), T.float32)
            acc2 = T.alloc_fragment((M, D), T.float32)
            ready = T.alloc_barrier(arrive_count=128)
            with T.ws(0):
                T.copy(A[0, 0], A_s)
                T.copy(B[0, 0], B1)
                T.copy(B[0, D], B2)
                T.barrier_arrive(ready)
            with T.ws(1):
                T.barrier_wait(ready, 0)
                T.gemm(A_s, B1, acc1, clear_accum=True)
                T.copy(acc1, P1)
                T.copy(P1, C[0, 0])
            with T.ws(2):
                T.barrier_wait(ready, 0)
                T.gemm(A_s, B2, acc2, clear_accum=True)
                T.copy(acc2, P2 if not aliased else P1)
                T.copy(P2 if not aliased else P1, C[0, D])
    return main, (M, K, N)


@pytest.mark.parametrize("D", [64, 128])
def test_separate_consumers_private_buffers(D):
    prim, (M, K, N) = two_consumers(D)
    a, b = randn(M, K, dtype=torch.float16, seed=5), randn(K, N, dtype=torch.float16, seed=6)
    after = assert_same_under_schedules(prim, [a, b, torch.empty(M, N, dtype=torch.float16)], 2)
    plan = after.plan(SharedMemoryPlan)
    ranges = {n: (o, o + size) for n, o, size in plan.ranges}
    # only within one consumer may a buffer reuse another's bytes (its result tile takes its B
    # tile's, dead after its gemm); the consumers' buffers never share
    reused = {frozenset(p) for p in plan.reuses}
    assert reused <= {frozenset(("B1", "P1")), frozenset(("B2", "P2"))}, plan.reuses
    assert all(frozenset(p) in reused for p in overlapping(ranges)), ranges
    ref = (a.double() @ b.double())
    got = run_interp(after, [a, b, torch.empty(M, N, dtype=torch.float16)], 2, seed=7)
    assert (got.double() - ref).abs().max() < 0.1


# ----------------------------------------------------------------------------------------------
# deliberately wrong lowerings are caught


def overlapping(ranges: dict) -> list:
    items = sorted(ranges.items(), key=lambda kv: kv[1])
    return [(a, b) for (a, ra), (b, rb) in zip(items, items[1:]) if rb[0] < ra[1]]


@pytest.mark.parametrize("D", [64, 128])
def test_ws4_aliased_private_buffers_are_caught(D):
    # An allocator that treats T.ws(1) and T.ws(2) like if/else branches gives P1 and P2 the
    # same bytes: here, the same buffer. The interpreter sees the two roles race on it.
    prim, (M, K, N) = two_consumers(D, aliased=True)
    a, b = randn(M, K, dtype=torch.float16, seed=5), randn(K, N, dtype=torch.float16, seed=6)
    kernel = lower(build_kernel(prim), HOPPER)
    with pytest.raises(RaceError, match="P1"):
        for seed in SEEDS:
            run_interp(kernel, [a, b, torch.empty(M, N, dtype=torch.float16)], 2, seed)
    # and the byte-range check the tests apply to plan_buffers flags such an allocation
    assert overlapping({"P1": (0, M * D * 2), "P2": (0, M * D * 2)})


@pytest.mark.parametrize("block_M", [128, 256])
def test_ws2_merged_consumer_layout(block_M):
    N = 128
    ours = layouts.accumulator_for(block_M, N, 8, 16)
    owners = {}
    for i in range(block_M):
        for j in range(N):
            owners.setdefault(layouts.element_to_thread(ours, block_M, N, i, j), []).append((i, j))
    assert all(len(v) == 1 for v in owners.values()) and len(owners) == block_M * N
    rows_of_group = lambda g: {i for (t, _), es in owners.items() if t // 128 == g for i, _ in es}  # noqa: E731
    for g in (0, 1):            # 64-row slabs alternate between the two warp groups
        assert rows_of_group(g) == {i for i in range(block_M) if (i // 64) % 2 == g}
    # The known failure: a merged group lowered as one warp group's MMA code run by both groups.
    wrong = layouts.WgmmaAccumulator((4, 1), ours.instr_shape)
    covered = {(i, j) for i in range(block_M) for j in range(N)
               if layouts.element_to_thread(wrong, block_M, N, i, j)[0] < 128}
    threads = {layouts.element_to_thread(wrong, block_M, N, i, j)[0] for i in range(block_M) for j in range(N)}
    assert max(threads) < 128          # the second warp group owns nothing: half the work lost
    assert len(covered) == block_M * N and not layouts.warp_partition_ok(4, 1, 8, block_M, N)


def lowered_auto_gemm(num_stages=2):
    prim = matmul.fn(128, 96, 96, block_M=64, block_N=32, block_K=32, num_stages=num_stages)
    return lower(build_kernel(prim), HOPPER)


def consumer_loop(kernel):
    role = next(r for s in walk(kernel.body) if isinstance(s, ir.WarpSpecialize) for r in s.roles
                if r.warpgroups == (1,))
    return role, next(s for s in walk(role.body) if isinstance(s, ir.For))


def replace_stmt(kernel, old, new):
    return transform(kernel, lambda n: new if n is old else None)


def test_ws5_release_before_wgmma_wait_is_caught():
    ours = lowered_auto_gemm(num_stages=1)        # one stage: gemm; wait 0; arrive
    verify_async.run(ours)
    _, loop = consumer_loop(ours)
    gemm, wait, arrive = loop.body.stmts[-3:]
    assert isinstance(wait, ir.GemmWait) and isinstance(arrive, ir.BarrierArrive)
    wrong_loop = dataclasses.replace(loop, body=ir.Seq(loop.body.stmts[:-3] + (gemm, arrive, wait), loop.loc))
    with pytest.raises(CompileError, match="releasing 'A_s' while the wgmma"):
        verify_async.run(replace_stmt(ours, loop, wrong_loop))


def test_ws5_accumulator_read_before_wait_is_caught():
    ours = lowered_auto_gemm(num_stages=overlap_mma.MIN_STAGES)     # the wgmma kept in flight
    verify_async.run(ours)
    role, loop = consumer_loop(ours)
    after_loop = role.body.stmts[role.body.stmts.index(loop) + 1]
    assert isinstance(after_loop, ir.GemmWait) and after_loop.outstanding == 0
    wrong_body = tuple(s for s in role.body.stmts if s is not after_loop)
    wrong = replace_stmt(ours, role.body, dataclasses.replace(role.body, stmts=wrong_body))
    with pytest.raises(CompileError, match="uses accumulator 'C_f' while the wgmma"):
        verify_async.run(wrong)


def with_arrive_count(kernel, name, count):
    return transform(kernel, lambda n: dataclasses.replace(n, arrive_counts=(count,) * len(n.arrive_counts))
                     if isinstance(n, ir.Buffer) and n.name == name else None)


def test_ws6_release_by_one_of_two_reading_groups_is_caught():
    # ws(1, 2) reads the ring with both warp groups; an `empty` barrier completed by 128 threads
    # lets the producer overwrite a stage while the second group may still read it. K > block_K.
    M, N, K = 128, 64, 192
    prim = matmul.fn(M, N, K, block_M=128, block_N=64, block_K=32, num_stages=2)
    prim_threads = dataclasses.replace(build_kernel(prim), threads=256)   # two consumer groups
    ours = lower(prim_threads, HOPPER)
    assert dict((s.buffer.name, s.buffer.arrive_counts) for s in walk(ours.body)
                if isinstance(s, ir.Alloc))["empty"] == (256, 256)
    a, b = randn(M, K, dtype=torch.float16, seed=8), randn(K, N, dtype=torch.float16, seed=9)
    wrong = with_arrive_count(ours, "empty", 128)
    with pytest.raises((RaceError, DeadlockError)):
        for seed in SEEDS:
            run_interp(wrong, [a, b, torch.empty(M, N, dtype=torch.float16)], 2, seed)
    # legalize refuses such a count outright
    with pytest.raises(CompileError, match="counts 128 arriving threads"):
        from tilews.lowering.passes import legalize_wgmma
        legalize_wgmma.run(with_arrive_count(lower(prim_threads, HOPPER, upto="legalize"), "empty", 128), HOPPER)


def test_ws5_tma_store_without_proxy_fence_is_caught():
    ours = lowered_auto_gemm()
    fences = [s for s in walk(ours.body) if isinstance(s, ir.ProxyFence)]
    assert len(fences) == 1
    wrong = transform(ours, lambda n: dataclasses.replace(n, stmts=tuple(
        t for t in n.stmts if not isinstance(t, ir.ProxyFence))) if isinstance(n, ir.Seq) else None)
    with pytest.raises(CompileError, match="asynchronous proxy after ordinary stores"):
        verify_async.run(wrong)


def test_explicit_shared_staging_gets_a_proxy_fence():
    # the user stages the result through shared memory themselves (acc -> P -> C): lowering the
    # P -> C copy to a TMA store must fence the ordinary stores to P first
    k = lower(build_kernel(two_consumers(64)[0]), HOPPER)
    for role in (r for s in walk(k.body) if isinstance(s, ir.WarpSpecialize) for r in s.roles[1:]):
        kinds = [type(s).__name__ for s in role.body.stmts]
        assert kinds[-4:] == ["Copy", "ProxyFence", "Copy", "BulkStoreWait"], kinds


def block_sparse_gemm(M, N, K, block_M=64, block_N=32, block_K=32, stages=2, threads=128,
                      dtype=T.float16):
    """C = A @ B over the K tiles BlockMask selects (per row block): a guarded pipelined loop."""
    @T.prim_func
    def main(A: T.Tensor((M, K), dtype), B: T.Tensor((K, N), dtype),
             BlockMask: T.Tensor((T.ceildiv(M, block_M), T.ceildiv(K, block_K)), T.int32),
             C: T.Tensor((M, N), dtype)):
        with T.Kernel(T.ceildiv(N, block_N), T.ceildiv(M, block_M), threads=threads) as (bx, by):
            A_s = T.alloc_shared((block_M, block_K), dtype)
            B_s = T.alloc_shared((block_K, block_N), dtype)
            C_f = T.alloc_fragment((block_M, block_N), T.float32)
            T.clear(C_f)
            for k in T.Pipelined(T.ceildiv(K, block_K), num_stages=stages):
                if BlockMask[by, k] != 0:
                    T.copy(A[by * block_M, k * block_K], A_s)
                    T.copy(B[k * block_K, bx * block_N], B_s)
                    T.gemm(A_s, B_s, C_f)
            T.copy(C_f, C[by * block_M, bx * block_N])
    return main


def sparse_case(stages):
    M, N, K = 128, 64, 192
    a, b = randn(M, K, dtype=torch.float16, seed=15), randn(K, N, dtype=torch.float16, seed=16)
    mask = torch.tensor([[1, 0, 0, 1, 1, 0], [0, 1, 1, 0, 0, 1]], dtype=torch.int32)
    return block_sparse_gemm(M, N, K, stages=stages), [a, b, mask, torch.empty(M, N, dtype=torch.float16)]


@pytest.mark.parametrize("stages", [1, 2, 3])
def test_ws8_guarded_iterations_advance_phases_only_when_run(stages):
    prim, args = sparse_case(stages)
    after = assert_same_under_schedules(prim, args, 3)
    a, b, mask = args[:3]
    keep = mask.repeat_interleave(32, dim=1).repeat_interleave(64, dim=0).to(torch.float64)
    ref = (a.double() * keep) @ b.double()
    got = run_interp(after, args, 3)
    assert (got.double() - ref).abs().max() < 0.05
    counters = {s.buffer.name for s in walk(after.body) if isinstance(s, ir.Alloc)
                and s.buffer.scope is ir.Scope.LOCAL}
    assert counters == {"produced", "consumed"}


@pytest.mark.parametrize("stages", [1, 2])
def test_ws8_phases_from_the_loop_index_are_caught(stages):
    # The known failure: a guarded body whose ring slot and parity follow the loop index, so a
    # skipped iteration leaves the barriers out of step with what the next wait expects: a wait
    # passes on the wrong phase (a read before the write) or never passes (deadlock).
    prim, args = sparse_case(stages)
    ours = lower(build_kernel(prim), HOPPER)
    loop_var = next(s.var for s in walk(ours.body) if isinstance(s, ir.For))
    wrong = transform(ours, lambda n: loop_var if isinstance(n, ir.Load)
                      and n.buffer.name in ("produced", "consumed") else None)
    with pytest.raises((DeadlockError, RaceError, UninitializedReadError)):
        for seed in SEEDS:
            run_interp(wrong, args, 3, seed)


@pytest.mark.parametrize("stages", [1, 2, 3])
@pytest.mark.parametrize("sms", [3, 5])          # 12 tiles do not divide evenly among 5 blocks
def test_ws11_persistent_gemm(stages, sms):
    from examples.gemm import persistent_matmul
    M, N, K = 200, 96, 100                        # ragged M and K
    prim = persistent_matmul.fn(M, N, K, block_M=64, block_N=32, block_K=32, num_stages=stages,
                                threads=128, num_sms=sms, group_size=2, dtype=T.float16)
    a, b = randn(M, K, dtype=torch.float16, seed=17), randn(K, N, dtype=torch.float16, seed=18)
    after = assert_same_under_schedules(prim, [a, b, torch.empty(M, N, dtype=torch.float16)], 2)
    got = run_interp(after, [a, b, torch.empty(M, N, dtype=torch.float16)], 2, seed=3)
    assert (got.double() - a.double() @ b.double()).abs().max() < 0.05
    ws = next(s for s in walk(after.body) if isinstance(s, ir.WarpSpecialize))
    producer, consumer = ws.roles
    # docs/ws-semantics.md #11: the producer's loop nest holds only loads; the consumer's holds the
    # epilogue per tile, after its k loop
    tile_loop = consumer.body.stmts[0]
    assert isinstance(tile_loop, ir.For) and tile_loop.kind is ir.ForKind.PERSISTENT
    assert isinstance(tile_loop.body.stmts[-1], ir.Copy)
    assert tile_loop.body.stmts[-1].dst.buffer.scope is ir.Scope.GLOBAL
    assert not any(isinstance(s, ir.Copy) and s.dst.buffer.scope is ir.Scope.GLOBAL
                   for s in walk(producer.body))


def test_ws11_persistent_ring_count_runs_across_tiles():
    # one running count over (tile, k): restarting it per tile would put the producer and the
    # consumer a phase apart whenever the tile's k count is not a multiple of the stages
    from examples.gemm import persistent_matmul
    M, N, K = 128, 64, 128                         # 4 k tiles, 3 stages (the wgmma in flight)
    prim = persistent_matmul.fn(M, N, K, block_M=64, block_N=32, block_K=32, num_stages=3,
                                threads=128, num_sms=2, group_size=2, dtype=T.float16)
    ours = lower(build_kernel(prim), HOPPER)
    tile_var = next(s.var for s in walk(ours.body) if isinstance(s, ir.For) and s.kind is ir.ForKind.PERSISTENT)
    zero = ir.Const(0, ir.DType.I32)

    def restart_per_tile(n):      # only the ring slots and parities forget the tiles done
        if isinstance(n, (ir.BarrierRef, ir.BarrierWait)) or (
                isinstance(n, ir.Region) and n.buffer.scope is ir.Scope.SHARED):
            return transform(n, lambda m: zero if m == tile_var else None)
        return None
    wrong = transform(ours, restart_per_tile)
    a, b = randn(M, K, dtype=torch.float16, seed=19), randn(K, N, dtype=torch.float16, seed=20)
    args = [a, b, torch.empty(M, N, dtype=torch.float16)]
    with pytest.raises((DeadlockError, RaceError, UninitializedReadError)):
        for seed in SEEDS:
            run_interp(wrong, args, 2, seed)


@pytest.mark.parametrize("sms", [2, 3])
@pytest.mark.parametrize("stages", [1, 2, 4])
def test_ws11_pingpong_consumers_alternate_tiles(sms, stages):
    from examples.ws_gemm import pingpong_matmul_program
    M, N, K = 320, 96, 96                         # 5 x 3 = 15 tiles: odd, uneven among blocks
    prim = pingpong_matmul_program(M, N, K, block_M=64, block_N=32, block_K=32, stages=stages,
                                   num_sms=sms, group_size=2, dtype=T.float16)
    a, b = randn(M, K, dtype=torch.float16, seed=21), randn(K, N, dtype=torch.float16, seed=22)
    after = assert_same_under_schedules(prim, [a, b, torch.empty(M, N, dtype=torch.float16)], 2)
    assert after.find_plan(AsyncPlan) is not None
    # `empty` is released by either consumer: one arrival per phase, whichever role it is
    assert dict(after.plan(AsyncPlan).barrier_counts)["empty"] == (1,) * stages
    got = run_interp(after, [a, b, torch.empty(M, N, dtype=torch.float16)], 2, seed=5)
    assert (got.double() - a.double() @ b.double()).abs().max() < 0.05


def test_ws11_pingpong_turn_with_the_wrong_parity_is_caught():
    # consumer 2 waiting for the turn of a main loop consumer 1 has not run yet deadlocks
    from examples.ws_gemm import pingpong_matmul_program
    M, N, K = 256, 64, 64
    prim = pingpong_matmul_program(M, N, K, block_M=64, block_N=32, block_K=32, stages=2,
                                   num_sms=2, group_size=2, dtype=T.float16)
    ours = lower(build_kernel(prim), HOPPER)
    flip = lambda n: dataclasses.replace(n, parity=ir.BinOp(ir.BinOpKind.XOR, n.parity, ir.Const(1, ir.DType.I32), ir.DType.I32)) \
        if isinstance(n, ir.BarrierWait) and n.barrier.buffer.name == "turn" and ir.as_int(n.barrier.index) == 1 else None  # noqa: E731
    wrong = transform(ours, flip)
    a, b = randn(M, K, dtype=torch.float16, seed=23), randn(K, N, dtype=torch.float16, seed=24)
    with pytest.raises((DeadlockError, RaceError, UninitializedReadError)):
        for seed in SEEDS:
            run_interp(wrong, [a, b, torch.empty(M, N, dtype=torch.float16)], 2, seed)


@pytest.mark.parametrize("sms", [5, 7])
def test_large_gemm_becomes_persistent_automatically(sms):
    M, N, K = 200, 96, 100                     # 4 x 3 = 12 tiles > sms: uneven among the blocks
    prim = matmul.fn(M, N, K, block_M=64, block_N=32, block_K=32, num_stages=2)
    a, b = randn(M, K, dtype=torch.float16, seed=25), randn(K, N, dtype=torch.float16, seed=26)
    before = build_kernel(prim)
    target = HOPPER.replace(num_sms=sms)
    after = lower(before, target)
    assert [ir.as_int(g) for g in after.grid] == [sms]
    assert any("persist: 12 tiles > " in n for n in after.notes)
    want = run_interp(before, [a, b, torch.empty(M, N, dtype=torch.float16)], 2)
    for seed in SEEDS:
        assert torch.equal(run_interp(after, [a, b, torch.empty(M, N, dtype=torch.float16)], 2, seed), want)
    small = lower(before, HOPPER.replace(num_sms=12))      # 12 tiles fit: unchanged grid
    assert [ir.as_int(g) for g in small.grid] == [3, 4]


def test_persistent_store_overlaps_the_next_tile_and_unwaited_rewrites_are_caught():
    from examples.gemm import persistent_matmul
    prim = persistent_matmul.fn(256, 128, 64, block_M=64, block_N=64, block_K=32, num_stages=2,
                                threads=128, num_sms=2, dtype=T.float16)
    ours = lower(build_kernel(prim), HOPPER)
    consumer = next(r for s in walk(ours.body) if isinstance(s, ir.WarpSpecialize) for r in s.roles
                    if r.warpgroups == (1,))
    tile_loop = consumer.body.stmts[0]
    kinds = [type(s).__name__ for s in tile_loop.body.stmts]
    # the store of tile t is waited for only before tile t+1 writes the staging buffer again
    assert kinds[-4:] == ["BulkStoreWait", "Copy", "ProxyFence", "Copy"], kinds
    assert isinstance(consumer.body.stmts[-1], ir.BulkStoreWait)
    verify_async.run(ours)
    wrong = transform(ours, lambda n: dataclasses.replace(n, stmts=tuple(
        t for t in n.stmts if not isinstance(t, ir.BulkStoreWait))) if n is tile_loop.body else None)
    with pytest.raises(CompileError, match="while the bulk store from line .* may still read it"):
        verify_async.run(wrong)
