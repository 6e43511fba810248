"""check_barriers: on hopper, an explicit T.ws program whose barriers deadlock is a compile error at
the user's lines (in the interpreter's words); correct programs pass untouched."""
import pytest
import torch

import tilews.language as T
from examples.gemm import matmul
from examples.ws_gemm import pingpong_matmul_program, ws_matmul_program, ws_ring_matmul_program
from tilews import CompileError
from tilews.lowering.errors import DeadlockError
from tilews.lowering.frontend import build_kernel
from tilews.lowering.interpreter.program import execute
from tilews.lowering.pipeline import lower
from tilews.lowering.interpreter.backend import INTERPRET
from tilews.triton_ext.gluon.backend import HOPPER

from ..helpers import marked_line


def handoff(producer_parity=1, done_count=256, bad_block=None):
    """The explicit GEMM's hand-over (producer T.ws(0), merged consumer T.ws(1, 2)) with switches
    that plant a wrong parity (in every block, or only in block ``bad_block``) or an arrive count
    no set of whole arriving roles completes."""
    M, N, K = 128, 64, 128

    @T.prim_func
    def main(A: T.Tensor((M, K), T.float16), B: T.Tensor((K, N), T.float16),
             C: T.Tensor((M, N), T.float16)):
        with T.Kernel(N // 32, M // 64, threads=384) as (bx, by):
            A_s = T.alloc_shared((64, 32), T.float16)
            B_s = T.alloc_shared((32, 32), T.float16)
            C_f = T.alloc_fragment((64, 32), T.float32)
            ready = T.alloc_barrier(arrive_count=128)
            done = T.alloc_barrier(arrive_count=done_count)  # <- done
            with T.ws(1, 2):
                T.clear(C_f)
            for ko in range(K // 32):
                with T.ws(0):
                    parity = producer_parity if bad_block is None else \
                        T.if_then_else(bx == bad_block, producer_parity, 1)
                    T.barrier_wait(done, (ko + parity) % 2)  # <- producer wait
                    T.copy(A[by * 64, ko * 32], A_s)
                    T.copy(B[ko * 32, bx * 32], B_s)
                    T.barrier_arrive(ready)
                with T.ws(1, 2):
                    T.barrier_wait(ready, ko % 2)  # <- consumer wait
                    T.gemm(A_s, B_s, C_f)
                    T.barrier_arrive(done)
            with T.ws(1, 2):
                T.copy(C_f, C[by * 64, bx * 32])
    return build_kernel(main)


def ring_copy(S, drain=None, guard=False):
    """Y = X through an S-stage ring over a runtime number of rows ``n``; ``drain`` = (slot,
    parity) adds a final producer wait on ``empty[slot]`` with a fixed parity (right for some trip
    counts only); ``guard`` puts the producer's arrival under a runtime flag."""
    @T.prim_func
    def main(X, Y, flag: T.int32):
        with T.Kernel(1, threads=256) as bx:
            buf = T.alloc_shared((S, 16, 64), T.float32)
            frag = T.alloc_fragment((16, 64), T.float32)
            full = T.alloc_barrier([128] * S)
            empty = T.alloc_barrier([128] * S)
            with T.ws(0):
                for k in T.serial(T.ceildiv(X.shape[0], 16)):
                    T.barrier_wait(empty[k % S], ((k // S) & 1) ^ 1)
                    T.copy(X[k * 16, 0], buf[k % S, :, :], barrier=full[k % S])
                    if guard:
                        if flag > 0:  # <- runtime guard
                            T.barrier_arrive(full[k % S])
                    else:
                        T.barrier_arrive(full[k % S])
                if drain is not None:
                    T.barrier_wait(empty[drain[0]], drain[1])  # <- drain
            with T.ws(1):
                for k in T.serial(T.ceildiv(X.shape[0], 16)):
                    T.barrier_wait(full[k % S], (k // S) & 1)
                    T.copy(buf[k % S, :, :], frag)
                    T.barrier_arrive(empty[k % S])
                    T.copy(frag, Y[k * 16, 0])
    spec = T.Tensor((T.dynamic("n"), 64), T.float32)
    return build_kernel(main, {"X": spec, "Y": spec})


def checked(kernel, target=HOPPER):
    return lower(kernel, target, upto="check_barriers")


def test_wrong_parity_is_the_interpreters_deadlock_at_compile_time():
    kernel = handoff(producer_parity=0)
    with pytest.raises(CompileError) as e:
        checked(kernel)
    assert e.value.loc.line == marked_line(handoff, "# <- producer wait")
    message = e.value.message
    assert message.startswith("deadlock in every block: every unfinished role is blocked")
    assert f"test_check_barriers.py:{marked_line(handoff, '# <- consumer wait')}:" in message
    assert "T.ws(0): " in message and "T.ws(1, 2): " in message
    assert "waits for the phase of parity 0 of barrier 'done'[0]" in message
    assert "waits for the phase of parity 0 of barrier 'ready'[0]" in message
    assert "tilews/lowering" not in str(e.value)
    # the interpreter, which does not check (its pipeline has no check_barriers) and reports it
    # at run time, says the same of every role
    assert "check_barriers" not in INTERPRET.pipeline.pass_names
    args = [torch.randn(128, 128).half(), torch.randn(128, 64).half(), torch.empty(128, 64).half()]
    with pytest.raises(DeadlockError) as ran:
        execute(kernel, args)
    assert str(ran.value).splitlines()[1:] == message.splitlines()[1:]


def test_a_deadlock_in_one_block_names_the_block():
    with pytest.raises(CompileError) as e:
        checked(handoff(producer_parity=0, bad_block=1))
    assert e.value.message.startswith("deadlock in block (1, 0): ")
    assert e.value.loc.line == marked_line(handoff, "# <- producer wait")


@pytest.mark.parametrize("count", [128, 200])
def test_arrive_count_no_roles_complete_is_refused_at_the_allocation(count):
    with pytest.raises(CompileError) as e:
        checked(handoff(done_count=count))
    assert e.value.loc.line == marked_line(handoff, "# <- done")
    assert f"barrier 'done' counts {count} arriving threads, but the roles arriving on it " \
           f"(T.ws(1, 2)) cannot complete a phase" in e.value.message


def test_runtime_trip_count_is_unrolled_over_a_period():
    for S in (1, 2, 3):
        kernel = ring_copy(S)
        assert checked(kernel) == kernel
    # S = 2: `empty[1]` completes a phase every second tile, and a wait on its parity 1 passes
    # while it has completed an even number: right for 0 or 1 tiles, a hang from 2 tiles (n = 17)
    with pytest.raises(CompileError) as e:
        checked(ring_copy(2, drain=(1, 1)))
    assert e.value.loc.line == marked_line(ring_copy, "# <- drain")
    assert e.value.message.startswith("deadlock in every block with n=17: ")
    assert "T.ws(1): finished" in e.value.message


def test_what_cannot_be_followed_is_left_unchecked_with_a_note():
    kernel = ring_copy(2, guard=True)
    out = checked(kernel)
    assert out.body == kernel.body
    assert out.notes[-1] == ("check_barriers: the barrier protocol is not checked for deadlocks on "
                             "target 'hopper': the condition of this branch depends on 'flag', "
                             f"known only at run time (line {marked_line(ring_copy, '# <- runtime guard')})")


@pytest.mark.parametrize("program", [
    lambda: ws_matmul_program(256, 192, 160, block_M=128, block_N=64, block_K=32),
    lambda: ws_ring_matmul_program(256, 64, 224, block_M=128, block_N=64, block_K=32, stages=1),
    lambda: ws_ring_matmul_program(256, 64, 224, block_M=128, block_N=64, block_K=32, stages=3),
    lambda: pingpong_matmul_program(320, 96, 96, block_M=64, block_N=32, block_K=32, stages=2,
                                    num_sms=3, group_size=2),
    lambda: pingpong_matmul_program(4096, 4096, 4096, num_sms=132),
    lambda: matmul.fn(96, 80, 96, block_M=64, block_N=32, block_K=32, num_stages=3),
], ids=["merged_consumer", "ring_1", "ring_3", "pingpong", "pingpong_132_sms", "automatic"])
def test_correct_programs_pass_unchanged(program):
    kernel = build_kernel(program())
    assert checked(kernel) == kernel
