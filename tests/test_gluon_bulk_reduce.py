"""A tile ``T.atomic_add`` of a shared tile into global memory on Hopper: a bulk (TMA)
reduce-add (``triton_ext/gluon/bulk_reduce.py``, legalize_wgmma, overlap_store).

* A split-K GEMM whose blocks add their partial tiles into C through a shared tile stays
  warp-specialized; the lowered program (the add followed by its wait) runs on the interpreter
  and gives A @ B (float32, the splits' order free); its sm_90a PTX has the reduce-add
  (``cp.reduce.async.bulk.tensor ... .add``) after a proxy fence, waited for with ``.read``.
* In a loop (the attention backward's dQ with ``dq_tile_add``) the wait moves to just before the
  tile's next write (overlap_store), so the add overlaps the next iteration.
* A tile add of a fragment is refused on Gluon, saying how to write it (the program then runs
  with ``triton.language``)."""
from __future__ import annotations

import re

import pytest
import torch

import tilews.language as T
from tilews.lowering import interpreter, ir
from tilews.lowering.frontend import build_kernel
from tilews.lowering.pipeline import lower
from tilews.lowering.plans import AsyncPlan, AsyncRefusal
from tilews.lowering.traverse import walk
from tilews.triton_ext.gluon.backend import HOPPER

from .helpers import gluon_program, randn, unwaited_global_accesses


def split_k_add(M, N, K, bm=64, bn=64, bk=32, splits=2, through_shared=True):
    per = K // bk // splits

    @T.prim_func
    def main(A: T.Tensor((M, K), T.float16), B: T.Tensor((K, N), T.float16),
             C: T.Tensor((M, N), T.float32)):
        with T.Kernel(N // bn, M // bm, splits, threads=128) as (bx, by, bz):
            A_s = T.alloc_shared((bm, bk), T.float16)
            B_s = T.alloc_shared((bk, bn), T.float16)
            C_f = T.alloc_fragment((bm, bn), T.float32)
            T.clear(C_f)
            for k in T.Pipelined(per, num_stages=2):
                T.copy(A[by * bm, (bz * per + k) * bk], A_s)
                T.copy(B[(bz * per + k) * bk, bx * bn], B_s)
                T.gemm(A_s, B_s, C_f)
            if through_shared:
                C_s = T.alloc_shared((bm, bn), T.float32)
                T.copy(C_f, C_s)
                T.atomic_add(C[by * bm, bx * bn], C_s)
            else:
                T.atomic_add(C[by * bm, bx * bn], C_f)
    return build_kernel(main)


def _adds(kernel):
    return [s for s in walk(kernel.body) if isinstance(s, ir.AtomicAdd) and isinstance(s.value, ir.Region)]


def test_a_shared_tile_is_added_by_one_bulk_reduce():
    M, N, K = 128, 128, 256
    kernel = lower(split_k_add(M, N, K), HOPPER)
    assert kernel.find_plan(AsyncPlan) is not None, kernel.notes
    assert ("C", (64, 64)) in kernel.plan(AsyncPlan).tma_descriptors
    a, b = randn(M, K, dtype=torch.float16, seed=1), randn(K, N, dtype=torch.float16, seed=2)
    c = torch.zeros(M, N)
    interpreter.run(kernel, [a, b, c])
    torch.testing.assert_close(c.double(), a.double() @ b.double(), rtol=1e-5, atol=1e-4)

    ptx = gluon_program(kernel).asm["ptx"]
    reduce = [i for i, line in enumerate(ptx.split("\n")) if "cp.reduce.async.bulk.tensor" in line]
    assert len(reduce) == 1 and ".add." in ptx.split("\n")[reduce[0]]
    before = "\n".join(ptx.split("\n")[:reduce[0]])
    assert before.rfind("fence.proxy.async") > before.rfind("st.shared")
    assert re.search(r"cp\.async\.bulk\.wait_group\.read\s+0", ptx)
    assert unwaited_global_accesses(ptx) == []       # the reduce-add waits for the previous grid


@pytest.mark.parametrize("sms", [0, 4], ids=["grid", "persistent"])
def test_in_a_loop_the_wait_moves_before_the_next_write(sms):
    # persistent: the main loop sits in the tile loop, which has bulk stores of its own (dK, dV)
    from tilews.ops.attention_backward import bwd_program
    config = HOPPER.replace(num_sms=sms)
    kernel = lower(build_kernel(bwd_program(1, 2, 2, 512, 64, False, 512, dq_tile_add=True)), config)
    assert kernel.find_plan(AsyncPlan) is not None, kernel.notes
    assert any("persist" in n for n in kernel.notes) == bool(sms)
    adds = _adds(kernel)      # one per consumer role: D64's roles each add their own dQ partial
    assert len(adds) == 2
    for add in adds:
        loop = next(s for s in walk(kernel.body) if isinstance(s, ir.For) and add in s.body.stmts)
        body = list(loop.body.stmts)
        at = body.index(add)
        write = next(i for i, s in enumerate(body)
                     if isinstance(s, ir.Copy) and s.dst.buffer == add.value.buffer)
        assert not (at + 1 < len(body) and isinstance(body[at + 1], ir.BulkStoreWait))
        waits = [i for i, s in enumerate(body) if isinstance(s, ir.BulkStoreWait)]
        assert len(waits) == 1 and waits[0] < write


def test_a_fragment_added_as_a_tile_is_refused_with_the_way_to_write_it():
    kernel = lower(split_k_add(128, 128, 256, through_shared=False), HOPPER)
    refusal = kernel.find_plan(AsyncRefusal)
    assert refusal is not None and "add a fragment through a shared tile" in refusal.reason
