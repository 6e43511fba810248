"""The reference interpreter on warp-specialized programs: mbarrier semantics, random schedules,
asynchronous copies, and the bugs it must catch (races, deadlocks) at the user's line."""

import pytest
import torch

import tilews.language as T
from tilews.lowering.errors import DeadlockError, RaceError, UninitializedReadError
from tilews.lowering.frontend import build_kernel
from tilews.lowering.interpreter.barriers import MBarrier
from tilews.lowering.interpreter.program import execute

NAN = float("nan")
M, N, K = 96, 80, 100            # 2 x 2 blocks of 64 x 64, 4 K tiles of 32 (all ragged)
SEEDS = range(20)


def line_of(tag: str) -> int:
    """The line of this file carrying the comment ``# <tag>``."""
    lines = open(__file__).read().splitlines()
    hits = [n for n, text in enumerate(lines, 1) if text.rstrip().endswith(f"# <{tag}>")]
    assert len(hits) == 1, tag
    return hits[0]


def where(tag: str) -> str:
    return f"test_interpreter_ws.py:{line_of(tag)}:"


@pytest.fixture(scope="module")
def operands():
    torch.manual_seed(0)
    A, B = torch.randn(M, K).half(), torch.randn(K, N).half()
    return A, B, A.double() @ B.double()


def gemm_result(kernel, operands, seed, check=True):
    A, B, _ = operands
    C = torch.full((M, N), NAN).half()
    trace = execute(kernel, [A, B, C], seed=seed, check=check)
    return C, trace


def assert_gemm(C, operands):
    torch.testing.assert_close(C.double(), operands[2], rtol=1e-3, atol=1e-3)


# ----------------------------------------------------------------------------------------------
# The explicit warp-specialized GEMM of docs/design.md §2, with switches that plant bugs.


def ws_gemm(consumer_waits=True, producer_parity=1, consumer_parity=0, block_M=64, block_N=64,
            block_K=32, dtype=T.float16):
    @T.prim_func
    def main(A: T.Tensor((M, K), dtype), B: T.Tensor((K, N), dtype), C: T.Tensor((M, N), dtype)):
        with T.Kernel(T.ceildiv(N, block_N), T.ceildiv(M, block_M), threads=384) as (bx, by):
            A_s = T.alloc_shared((block_M, block_K), dtype)
            B_s = T.alloc_shared((block_K, block_N), dtype)
            C_f = T.alloc_fragment((block_M, block_N), T.float32)
            ready = T.alloc_barrier(arrive_count=128)
            done = T.alloc_barrier(arrive_count=256)
            with T.ws(1, 2):
                T.clear(C_f)
            for ko in range(T.ceildiv(K, block_K)):
                with T.ws(0):
                    T.barrier_wait(done, (ko + producer_parity) % 2)  # <producer-wait>
                    T.copy(A[by * block_M, ko * block_K], A_s)  # <producer-copy>
                    T.copy(B[ko * block_K, bx * block_N], B_s)
                    T.barrier_arrive(ready)
                with T.ws(1, 2):
                    if consumer_waits:
                        T.barrier_wait(ready, (ko + consumer_parity) % 2)  # <consumer-wait>
                    T.gemm(A_s, B_s, C_f)  # <consumer-gemm>
                    T.barrier_arrive(done)
            with T.ws(1, 2):
                T.copy(C_f, C[by * block_M, bx * block_N])
    return main


def test_ws_gemm_is_right_under_every_seed_and_seeds_interleave_differently(operands):
    kernel = build_kernel(ws_gemm())
    traces = set()
    for seed in SEEDS:
        C, trace = gemm_result(kernel, operands, seed)
        assert_gemm(C, operands)
        traces.add(tuple(trace))
        assert set(trace) == {"T.ws(0)", "T.ws(1, 2)"}
    assert len(traces) >= 15, "seeds should give different interleavings"
    assert gemm_result(kernel, operands, 3)[1] == gemm_result(kernel, operands, 3)[1]


def test_missing_consumer_wait_is_a_race(operands):
    kernel = build_kernel(ws_gemm(consumer_waits=False))
    raised = []
    for seed in range(10):
        with pytest.raises((RaceError, UninitializedReadError)) as e:
            gemm_result(kernel, operands, seed)
        raised.append(e.value)
    # the consumer may read A_s before any write (poisoned) or after an unordered write (race)
    races = [str(e) for e in raised if isinstance(e, RaceError)]
    assert races, "some schedule must let the producer write first"
    for message in races:
        assert where("consumer-gemm") in message and where("producer-copy") in message
        assert "'A_s'" in message and "T.ws(0)" in message and "T.ws(1, 2)" in message


def test_wrong_producer_parity_deadlocks(operands):
    kernel = build_kernel(ws_gemm(producer_parity=0))
    for seed in range(5):
        with pytest.raises(DeadlockError) as e:
            gemm_result(kernel, operands, seed)
        message = str(e.value)
        assert where("producer-wait") in message and where("consumer-wait") in message
        assert "'done'[0]" in message and "'ready'[0]" in message


def test_wrong_consumer_parity_reads_unordered_data(operands):
    kernel = build_kernel(ws_gemm(consumer_parity=1))
    kinds = set()
    for seed in range(10):
        with pytest.raises((RaceError, UninitializedReadError)) as e:
            gemm_result(kernel, operands, seed)
        assert where("consumer-gemm") in str(e.value)
        kinds.add(type(e.value))
    assert RaceError in kinds


# ----------------------------------------------------------------------------------------------
# Two consumer roles, each computing half of the M rows of a tile.


def ws_gemm_two_consumers(share_output=False, block_M=64, block_N=64, block_K=32, dtype=T.float16):
    half = block_M // 2

    @T.prim_func
    def main(A: T.Tensor((M, K), dtype), B: T.Tensor((K, N), dtype), C: T.Tensor((M, N), dtype)):
        with T.Kernel(T.ceildiv(N, block_N), T.ceildiv(M, block_M), threads=384) as (bx, by):
            A_s = T.alloc_shared((block_M, block_K), dtype)
            B_s = T.alloc_shared((block_K, block_N), dtype)
            C_s = T.alloc_shared((block_M, block_N), dtype)
            top = T.alloc_fragment((half, block_N), T.float32)
            bottom = T.alloc_fragment((half, block_N), T.float32)
            ready = T.alloc_barrier(arrive_count=128)
            done = T.alloc_barrier(arrive_count=256)       # both consumers arrive (128 each)
            with T.ws(1):
                T.clear(top)
            with T.ws(2):
                T.clear(bottom)
            for ko in range(T.ceildiv(K, block_K)):
                with T.ws(0):
                    T.barrier_wait(done, (ko + 1) % 2)
                    T.copy(A[by * block_M, ko * block_K], A_s)
                    T.copy(B[ko * block_K, bx * block_N], B_s)
                    T.barrier_arrive(ready)
                with T.ws(1):
                    T.barrier_wait(ready, ko % 2)
                    T.gemm(A_s[0:half, :], B_s, top)
                    T.barrier_arrive(done)
                with T.ws(2):
                    T.barrier_wait(ready, ko % 2)
                    T.gemm(A_s[half:block_M, :], B_s, bottom)
                    T.barrier_arrive(done)
            with T.ws(1):
                T.copy(top, C_s[0:half, :])  # <top-store>
                T.copy(C_s[0:half, :], C[by * block_M, bx * block_N])
            with T.ws(2):
                if share_output:   # the bug: the same rows of C_s as T.ws(1), unordered
                    T.copy(bottom, C_s[0:half, :])  # <bottom-store>
                    T.copy(bottom, C[by * block_M + half, bx * block_N])
                else:
                    T.copy(bottom, C_s[half:block_M, :])
                    T.copy(C_s[half:block_M, :], C[by * block_M + half, bx * block_N])
    return main


def test_two_consumer_roles_split_rows(operands):
    kernel = build_kernel(ws_gemm_two_consumers())
    for seed in range(5):
        C, trace = gemm_result(kernel, operands, seed)
        assert_gemm(C, operands)
        assert {"T.ws(1)", "T.ws(2)"} <= set(trace)


def test_two_roles_writing_one_shared_region_race(operands):
    kernel = build_kernel(ws_gemm_two_consumers(share_output=True))
    for seed in range(5):
        with pytest.raises(RaceError) as e:
            gemm_result(kernel, operands, seed)
        message = str(e.value)
        assert where("top-store") in message and where("bottom-store") in message
        assert "'C_s'" in message and "T.ws(1)" in message and "T.ws(2)" in message


# ----------------------------------------------------------------------------------------------
# Asynchronous copies (TMA-like): T.copy(..., barrier=bar) lands later, on bar's transactions.


def ws_gemm_async(stages=1, copy_bar="full", arrive_first=False, block_M=64, block_N=64,
                  block_K=32, dtype=T.float16):
    @T.prim_func
    def main(A: T.Tensor((M, K), dtype), B: T.Tensor((K, N), dtype), C: T.Tensor((M, N), dtype)):
        with T.Kernel(T.ceildiv(N, block_N), T.ceildiv(M, block_M), threads=384) as (bx, by):
            A_s = T.alloc_shared((stages, block_M, block_K), dtype)
            B_s = T.alloc_shared((stages, block_K, block_N), dtype)
            C_f = T.alloc_fragment((block_M, block_N), T.float32)
            full = T.alloc_barrier([128] * stages)
            empty = T.alloc_barrier([256] * stages)
            other = T.alloc_barrier([128] * stages)
            landed = full if copy_bar == "full" else other
            with T.ws(1, 2):
                T.clear(C_f)
            for ko in range(T.ceildiv(K, block_K)):
                with T.ws(0):
                    s = ko % stages
                    T.barrier_wait(empty[s], (ko // stages + 1) % 2)
                    if arrive_first:
                        T.barrier_arrive(full[s])
                    T.copy(A[by * block_M, ko * block_K], A_s[s, :, :], barrier=landed[s])  # <async-copy>
                    T.copy(B[ko * block_K, bx * block_N], B_s[s, :, :], barrier=landed[s])
                    if not arrive_first:
                        T.barrier_arrive(full[s])
                with T.ws(1, 2):
                    s = ko % stages
                    T.barrier_wait(full[s], (ko // stages) % 2)
                    T.gemm(A_s[s, :, :], B_s[s, :, :], C_f)  # <async-gemm>
                    T.barrier_arrive(empty[s])
            with T.ws(1, 2):
                T.copy(C_f, C[by * block_M, bx * block_N])
    return main


@pytest.mark.parametrize("stages", [1, 2, 3])
def test_async_copies_complete_on_the_barrier(operands, stages):
    kernel = build_kernel(ws_gemm_async(stages))
    landings = 0
    for seed in range(20 if stages == 1 else 5):
        C, trace = gemm_result(kernel, operands, seed)
        assert_gemm(C, operands)
        landings += sum(name.startswith("land A_s") for name in trace)
    assert landings == (20 if stages == 1 else 5) * 4 * 4   # every copy landed: seeds x blocks x K tiles


def assert_async_race(message):
    assert where("async-copy") in message and where("async-gemm") in message
    assert "'A_s'" in message
    assert "asynchronous copy issued by T.ws(0)" in message and "T.ws(1, 2)" in message


def test_arriving_on_a_barrier_the_copy_does_not_complete_on_is_a_race(operands):
    """The producer arrives on ``full`` while its copies complete on another barrier: the
    consumer's wait on ``full`` does not cover the bytes still in flight."""
    kernel = build_kernel(ws_gemm_async(copy_bar="other"))
    for seed in range(5):
        with pytest.raises(RaceError) as e:
            gemm_result(kernel, operands, seed)
        assert_async_race(str(e.value))


def test_arriving_before_issuing_the_async_copy_is_a_race(operands):
    """The phase completes before the copy registers its bytes (they count towards the next
    phase), so the consumer may compute before the copy is issued (poisoned) or lands (race)."""
    kernel = build_kernel(ws_gemm_async(arrive_first=True))
    races = []
    for seed in range(10):
        with pytest.raises((RaceError, UninitializedReadError)) as e:
            gemm_result(kernel, operands, seed)
        assert where("async-gemm") in str(e.value)
        if isinstance(e.value, RaceError):
            races.append(str(e.value))
    assert races
    for message in races:
        assert_async_race(message)


def test_late_landing_corrupts_results_when_unchecked(operands):
    """Without checks the same bug shows as data: some schedule lets the consumer compute on a
    tile whose bytes have not landed (poisoned or stale)."""
    kernel = build_kernel(ws_gemm_async(copy_bar="other"))
    wrong = 0
    for seed in range(5):
        C, _ = gemm_result(kernel, operands, seed, check=False)
        wrong += not torch.allclose(C.double(), operands[2], rtol=1e-3, atol=1e-3)
    assert wrong > 0


def single_role_async_gemm(block_M=64, block_N=64, block_K=32, dtype=T.float16):
    @T.prim_func
    def main(A: T.Tensor((M, K), dtype), B: T.Tensor((K, N), dtype), C: T.Tensor((M, N), dtype)):
        with T.Kernel(T.ceildiv(N, block_N), T.ceildiv(M, block_M), threads=128) as (bx, by):
            A_s = T.alloc_shared((block_M, block_K), dtype)
            B_s = T.alloc_shared((block_K, block_N), dtype)
            C_f = T.alloc_fragment((block_M, block_N), T.float32)
            bar = T.alloc_barrier(arrive_count=128)
            T.clear(C_f)
            for ko in range(T.ceildiv(K, block_K)):
                T.copy(A[by * block_M, ko * block_K], A_s, barrier=bar)
                T.copy(B[ko * block_K, bx * block_N], B_s, barrier=bar)
                T.barrier_arrive(bar)
                T.barrier_wait(bar, ko % 2)
                T.gemm(A_s, B_s, C_f)
            T.copy(C_f, C[by * block_M, bx * block_N])
    return main


def test_kernel_without_roles_waits_for_its_own_async_copies(operands):
    kernel = build_kernel(single_role_async_gemm())
    for seed in range(5):
        C, trace = gemm_result(kernel, operands, seed)
        assert_gemm(C, operands)
        assert any(name.startswith("land B_s") for name in trace)


# ----------------------------------------------------------------------------------------------
# mbarrier semantics


def test_mbarrier_phases_parity_and_spill():
    bar = MBarrier("b", 0, count=256)
    assert bar.passes(1) and not bar.passes(0)      # fresh: the "previous" phase (parity 1) is done
    bar.arrive(128, None)
    assert not bar.passes(0) and bar.pending == 128
    bar.arrive(384, None)                           # completes phase 0; 256 spill: completes phase 1
    assert bar.phase == 2 and bar.pending == 256 and bar.passes(1) and not bar.passes(0)


def test_mbarrier_phase_waits_for_transaction_bytes():
    bar = MBarrier("b", 0, count=128)
    bar.expect_tx(4096)
    bar.arrive(128, {0: 5})
    assert bar.phase == 0 and not bar.passes(0)     # arrived, but the bytes are still in flight
    bar.complete_tx(4096, {("lane",): 1})
    assert bar.phase == 1 and bar.passes(0)
    assert bar.released(0) == {0: 5, ("lane",): 1}  # what a wait on parity 0 acquires
