"""overlap_gemms: a block's independent wgmmas issued together, each waited where first needed.

* The attention backward's loop body (five gemms): ``S^T = K Q^T`` and ``dP^T = V dO^T`` are
  issued back to back; the exponentials follow ``gemm_wait 1`` (dP^T still in flight), dS^T
  follows the dV gemm's issue under ``gemm_wait 1``, and dS's shared store is under the dK gemm;
  the ring slots are released after the final wait. With dQ's tile added by a bulk reduce-add
  (``dq_tile_add``), overlap_store's wait for the previous add stays just before dQ's shared
  store, after the final wait and the arrivals (before them, the arrival needed a barrier of its
  own: sm_90a SASS of the D64 loop, 6 ``BAR.SYNC`` instead of 5). The lowered program gives the
  float64 gradients on the interpreter (gemms there are synchronous, so a statement moved past
  one it depends on would show), and its sm_90a PTX waits with ``wgmma.wait_group 1``.
* The first gemm carries the loads of its ring slot into fragments: LSE is read from shared
  memory between ``S^T``'s slot wait and its issue (not behind both gemms' operand reads);
  Delta, read for ``dP^T``, stays after the first gemm wait.
* With the policy off (``TILEWS_OVERLAP_GEMMS=off``) every gemm is waited at once, as
  legalize_wgmma writes it.
* A statement that writes a gemm's register operand, or reads its accumulator, waits for it;
  a lone gemm is left alone.
"""
from __future__ import annotations

import dataclasses

import torch

import tilews.language as T
from tilews.lowering import interpreter, ir
from tilews.lowering.frontend import build_kernel
from tilews.lowering.pipeline import lower
from tilews.lowering.plans import AsyncPlan
from tilews.lowering.traverse import walk
from tilews.ops.attention_backward import bwd_program
from tilews.triton_ext.gluon.backend import HOPPER

from ..helpers import gluon_program, randn


def _consumer_loop(kernel: ir.Kernel) -> list:
    """The statements of the consumer's innermost loop holding gemms (a persistent kernel's
    main loop is inside its tile loop)."""
    ws = next(s for s in walk(kernel.body) if isinstance(s, ir.WarpSpecialize))
    consumer = max(ws.roles, key=lambda r: len(r.warpgroups))
    loop = [s for s in walk(consumer.body) if isinstance(s, ir.For)
            and any(isinstance(t, ir.Gemm) for t in s.body.stmts)][-1]
    return list(loop.body.stmts)


def _kinds(stmts, slots=False) -> list[str]:
    """What each statement is; with ``slots``, ring waits and loads of shared memory into
    fragments too."""
    out = []
    for s in stmts:
        if slots and isinstance(s, ir.BarrierWait):
            out.append(f"wait {s.barrier.buffer.name}")
        elif slots and isinstance(s, ir.Copy) and s.src.buffer.scope is ir.Scope.SHARED \
                and s.dst.buffer.scope is ir.Scope.FRAGMENT:
            out.append(f"load {s.src.buffer.name}")
        elif isinstance(s, ir.Gemm):
            out.append(f"gemm->{s.c.buffer.name}")
        elif isinstance(s, ir.GemmWait):
            out.append(f"wait{s.outstanding}")
        elif isinstance(s, ir.BarrierArrive):
            out.append(f"arrive {s.barrier.buffer.name}")
        elif isinstance(s, ir.BulkStoreWait):
            out.append(f"store wait{s.outstanding}")
        elif isinstance(s, ir.Copy) and s.dst.buffer.scope is ir.Scope.SHARED:
            out.append(f"copy ->{s.dst.buffer.name}")
        elif isinstance(s, ir.Parallel):
            written = {t.buffer.name for t in walk(s) if isinstance(t, ir.Store)}
            out.append("parallel " + ",".join(sorted(written)) if written else "parallel atomics")
    return out


def _backward(dim=64, seq=256):
    return build_kernel(bwd_program(1, 2, 2, seq, dim, False, seq))


def test_backward_gemms_issue_together_and_wait_where_needed():
    kernel = lower(_backward(), HOPPER, upto="overlap_gemms")
    assert kernel.find_plan(AsyncPlan) is not None, kernel.notes
    assert _kinds(_consumer_loop(kernel)) == [
        "gemm->sT", "gemm->dpT", "wait1", "parallel sT",
        "gemm->dv", "wait1", "parallel dsT",
        "gemm->dk", "copy ->dsT_s", "gemm->dq", "wait0", "arrive empty_dO_s", "arrive empty_Q_s",
        "parallel atomics"]


def test_the_first_gemm_carries_its_slots_loads():
    kinds = _kinds(_consumer_loop(lower(_backward(), HOPPER, upto="overlap_gemms")), slots=True)
    assert kinds[:9] == ["wait full_Q_s", "load lse_s", "gemm->sT", "wait full_dO_s", "gemm->dpT",
                         "wait1", "parallel sT", "load delta_s", "gemm->dv"], kinds


def test_bulk_store_wait_follows_the_final_wait_and_arrivals():
    # the merged consumer of two warp groups (D128's; D64's with TILEWS_SPLIT_PARTIALS=off)
    kernel = lower(build_kernel(bwd_program(1, 2, 2, 512, 64, False, 512, dq_tile_add=True)),
                   HOPPER.replace(num_sms=132, split_partials=False), upto="overlap_gemms")
    kinds = _kinds(_consumer_loop(kernel))
    assert kinds[kinds.index("gemm->dq"):] == [
        "gemm->dq", "wait0", "arrive empty_dO_s", "arrive empty_Q_s", "store wait0", "copy ->dq_s"], kinds


def test_off_waits_for_each_gemm_at_once():
    config = dataclasses.replace(HOPPER, policy=dataclasses.replace(HOPPER.policy, overlap_gemms=False))
    kinds = _kinds(_consumer_loop(lower(_backward(), config)))
    gemms = [i for i, k in enumerate(kinds) if k.startswith("gemm")]
    assert len(gemms) == 5 and all(kinds[i + 1] == "wait0" for i in gemms)


def test_backward_lowered_program_matches_float64_on_the_interpreter():
    backward_matches_float64(lower(_backward(64, 256), HOPPER), 64, 256)


def backward_matches_float64(kernel: ir.Kernel, D: int, S: int, seed=None) -> None:
    """The lowered non-causal backward ``kernel`` (B 1, H 2) gives float64 SDPA's gradients on
    the interpreter (``seed``: its schedule of the roles)."""
    B, H = 1, 2
    q, k, v, do = (randn(B, H, S, D, dtype=torch.float16, seed=i) for i in range(4))
    qq, kk, vv = (t.double().requires_grad_() for t in (q, k, v))
    out = torch.nn.functional.scaled_dot_product_attention(qq, kk, vv)
    lse = torch.logsumexp(qq @ kk.transpose(-1, -2) / D ** 0.5, -1) / torch.log(torch.tensor(2.0))
    delta = (out.detach() * do.double()).sum(-1)
    want = torch.autograd.grad(out, (qq, kk, vv), do.double())
    dq = torch.zeros(B, H, S, D)
    dk, dv = (torch.full((B, H, S, D), float("nan"), dtype=torch.float16) for _ in range(2))
    interpreter.run(kernel, [q, k, v, do, lse.float(), delta.float(), dq, dk, dv], seed=seed)
    for got, ref in zip((dq, dk, dv), want):
        torch.testing.assert_close(got.double(), ref, rtol=2e-2, atol=2e-2)


def test_backward_ptx_keeps_a_gemm_in_flight():
    ptx = gluon_program(lower(_backward(), HOPPER)).asm["ptx"]
    assert "wgmma.wait_group.sync.aligned 1;" in ptx


def _register_operand_kernel():
    @T.prim_func
    def main(A: T.Tensor((64, 64), T.float16), B: T.Tensor((64, 64), T.float16),
             C: T.Tensor((64, 64), T.float32), D: T.Tensor((64, 64), T.float32)):
        with T.Kernel(1, threads=256) as bx:
            A_s = T.alloc_shared((64, 64), T.float16)
            B_s = T.alloc_shared((64, 64), T.float16)
            P = T.alloc_fragment((64, 64), T.float16)
            acc = T.alloc_fragment((64, 64), T.float32)
            acc2 = T.alloc_fragment((64, 64), T.float32)
            T.clear(acc2)
            for k in T.Pipelined(2, num_stages=2):
                T.copy(A[0, 0], A_s)
                T.copy(B[0, 0], B_s)
                T.gemm(A_s, B_s, acc, clear_accum=True)
                T.copy(acc, P)
                T.gemm(P, B_s, acc2)
                for i, j in T.Parallel(64, 64):
                    P[i, j] = P[i, j] * 0.5            # rewrites the second gemm's register operand
            T.copy(acc, C[0, 0])
            T.copy(acc2, D[0, 0])
    return build_kernel(main)


def test_a_write_of_a_register_operand_waits_for_its_gemm():
    kernel = lower(_register_operand_kernel(), HOPPER)
    assert kernel.find_plan(AsyncPlan) is not None, kernel.notes
    kinds = _kinds(_consumer_loop(kernel))
    assert kinds.index("wait0", kinds.index("gemm->acc2")) < kinds.index("parallel P")
    a, b = randn(64, 64, dtype=torch.float16, seed=1), randn(64, 64, dtype=torch.float16, seed=2)
    c, d = torch.full((64, 64), float("nan")), torch.full((64, 64), float("nan"))
    interpreter.run(kernel, [a, b, c, d])
    acc = a.double() @ b.double()
    torch.testing.assert_close(c.double(), acc, rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(d.double(), 2 * acc.half().double() @ b.double(), rtol=1e-3, atol=1e-2)
