"""despecialize: explicit T.ws programs run as one stream where the barrier protocol allows it."""
import pytest

import tilews.language as T
from examples.ws_gemm import ws_matmul_program
from tilews import CompileError
from tilews.lowering import ir, printer
from tilews.lowering.frontend import build_kernel
from tilews.lowering.pipeline import lower
from tilews.lowering.interpreter.backend import INTERPRET
from tilews.triton_ext.gluon.backend import HOPPER
from tilews.triton_ext.tl.backend import TRITON_CPU, TRITON_GPU
from tilews.lowering.traverse import walk

from ..helpers import marked_line


def ring_copy(N, S, order="producer_first"):
    """Y = X through shared memory: a producer fills an S-stage ring (full/empty barrier pairs,
    asynchronous copies) for a consumer; ``order`` plants a role order or a parity that one stream
    cannot run."""
    @T.prim_func
    def main(X, Y):
        with T.Kernel(1, threads=256) as bx:
            buf = T.alloc_shared((16, 64), T.float32)
            frag = T.alloc_fragment((16, 64), T.float32)
            full = T.alloc_barrier([128] * S)
            empty = T.alloc_barrier([128] * S)
            for k in T.serial(T.ceildiv(X.shape[0], 16)):
                if order == "consumer_first":
                    with T.ws(1):
                        T.barrier_wait(full[k % S], (k // S) & 1)  # <- consumer first
                        T.copy(buf, frag)
                        T.barrier_arrive(empty[k % S])
                        T.copy(frag, Y[k * 16, 0])
                with T.ws(0):
                    if order == "late_parity":
                        T.barrier_wait(empty[k % S], (k // S) & 1)  # <- late producer wait
                    else:
                        T.barrier_wait(empty[k % S], ((k // S) & 1) ^ 1)
                    T.copy(X[k * 16, 0], buf, barrier=full[k % S])
                    T.barrier_arrive(full[k % S])
                if order != "consumer_first":
                    with T.ws(1):
                        T.barrier_wait(full[k % S], (k // S) & 1)
                        T.copy(buf, frag)
                        T.barrier_arrive(empty[k % S])
                        T.copy(frag, Y[k * 16, 0])
    spec = T.Tensor((N, 64), T.float32)
    return build_kernel(main, {"X": spec, "Y": spec})


def guarded():
    @T.prim_func
    def main(X: T.Tensor((64,), T.float32), flag: T.int32):
        with T.Kernel(1, threads=256) as bx:
            bar = T.alloc_barrier(arrive_count=128)
            with T.ws(0):
                if flag > 0:  # <- runtime guard
                    T.barrier_arrive(bar)
            with T.ws(1):
                T.barrier_wait(bar, 0)
    return build_kernel(main)


def ws_gemm():
    """The explicit warp-specialized GEMM of docs/design.md §2 (examples/ws_gemm.py)."""
    return build_kernel(ws_matmul_program(128, 128, 96, block_M=64, block_N=64))


def despecialized(kernel, target=TRITON_CPU):
    return lower(kernel, target, upto="despecialize")


def test_ws_gemm(expect):
    expect(printer.to_text(despecialized(ws_gemm())))


def test_ring_of_stages(expect):
    expect(printer.to_text(despecialized(ring_copy(96, S=2))))


def test_ring_with_runtime_trip_count():
    k = despecialized(ring_copy(T.dynamic("n"), S=3), TRITON_GPU)
    assert {type(s) for s in walk(k.body)} == {ir.Alloc, ir.For, ir.Copy}
    assert all(s.barrier is None for s in walk(k.body) if isinstance(s, ir.Copy))
    assert any(n.startswith("despecialize: ") for n in k.notes)


@pytest.mark.parametrize("target", [HOPPER, INTERPRET], ids=["hopper", "interpret"])
def test_not_run_with_warp_specialization(target):
    """Backends that run roles concurrently leave despecialize out of their pipelines."""
    assert "despecialize" not in target.pipeline.pass_names


def test_consumer_before_producer_is_refused():
    with pytest.raises(CompileError) as e:
        despecialized(ring_copy(96, S=2, order="consumer_first"))
    assert e.value.loc.line == marked_line(ring_copy, "# <- consumer first")
    assert "role T.ws(1) waits on `full[0]` (parity 0) before T.ws(0) arrives" in e.value.message
    assert "(at k=0)" in e.value.message and "tilews/lowering" not in str(e.value)


def test_wrong_parity_is_refused():
    with pytest.raises(CompileError) as e:
        despecialized(ring_copy(96, S=2, order="late_parity"))
    assert e.value.loc.line == marked_line(ring_copy, "# <- late producer wait")
    assert "waits on `empty[0]`" in e.value.message


def test_barrier_under_runtime_condition_is_refused():
    with pytest.raises(CompileError) as e:
        despecialized(guarded())
    assert e.value.loc.line == marked_line(guarded, "# <- runtime guard")
    assert "known only at run time" in e.value.message
