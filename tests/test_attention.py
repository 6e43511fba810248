"""Attention forward (FlashAttention's online softmax) on the Hopper path, without a GPU.

* Oracle: the interpreter's result for the frontend IR equals its result for the fully lowered
  Hopper IR, bit for bit, under random schedules (docs/ws-semantics.md #12), for the automatic
  program (``tilews/ops/attention.py``'s ``mha_fwd_program``) and the explicit one
  (``examples/attention.py``'s ``ws_mha_fwd_program``): causal or not, BHSD / BSHD, ragged
  sequence lengths, D 64 / 128, 1-3 stages, under each consumer schedule the Hopper target can
  choose (split consumer roles, one merged role, the softmax overlapped with the next gemm); the
  reference result is also checked against float32 SDPA, so the oracle never compares two wrong
  answers.
* Structure of the lowered IR: roles, the Q preload and its barrier, the gemms, the layout plan.
* Compile-only sm_90a builds: TTGIR / PTX of four configurations (wgmma counts derived from the
  block sizes and the gemm statements of the lowered IR).
* Wrong lowerings the oracle (or the layout model) must catch: a dropped rescale of the running
  output, a row reduction without its cross-thread step, P cast before the softmax's exp, a
  dropped causal or sequence-end mask, a consumer that does not wait for the preloaded Q.
* ``tilews.ops.attention``: argument errors, empty sequences, the fallback to triton.language
  with its reason, CPU numerics against SDPA.
* Hypothesis tests of ``infer_layouts``' fragment rules on small generated programs.

The structure and compile checks find S, P and O by what the gemms do with them (S = Q K^T
reads two shared operands, P V reads P from registers); the wrong-lowering tests find the
automatic program's fragments by name: a pass that splits the consumer renames them (``acc_s`` ->
``acc_s_0``, ``acc_s_1``); ``base`` strips that suffix.
"""
from __future__ import annotations

import collections
import dataclasses
import functools
import re

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import tilews
import tilews.language as T
from examples.attention import reference as sdpa
from examples.attention import ws_mha_fwd_program
from tilews.lowering import ir, layouts, verify, verify_async
from tilews.lowering.errors import DeadlockError, RaceError, UninitializedReadError
from tilews.lowering.frontend import build_kernel
from tilews.lowering.pipeline import lower
from tilews.lowering.plans import (AsyncPlan, AsyncRefusal, ConsumerSplit, LayoutPlan, PipelinePlan,
                                   SharedMemoryPlan)
from tilews.lowering.passes import warp_specialize
from tilews.triton_ext.gluon.backend import HOPPER
from tilews.lowering.traverse import buffers_read, buffers_written, transform, walk
from tilews.ops.attention import attention, mha_fwd_program

from .helpers import gluon_program, randn, rel_err
from .test_ws_oracle import run_interp

SEEDS = range(20)
_T_DTYPES = {torch.float16: T.float16, torch.bfloat16: T.bfloat16}

# The consumer schedules of the Hopper target: its default (one role per warp group, P V of
# block k - 1 in flight under the softmax of block k); the split roles waiting for each P V in
# its own iteration; the consumer kept as one role of two warp groups (the schedule of
# docs/ws-semantics.md #2); that role with P V deferred.
SCHEDULES = {
    "default": HOPPER,
    "split": HOPPER.replace(overlap_softmax=False),
    "merged": HOPPER.replace(split_consumers=False, overlap_softmax=False),
    "overlap": HOPPER.replace(split_consumers=False, overlap_softmax=True),
    "pingpong": HOPPER.replace(pingpong=True),
}


# ----------------------------------------------------------------------------------------------
# cases


@dataclasses.dataclass(frozen=True)
class Att:
    S: int
    D: int
    causal: bool
    layout: str = "bhsd"
    block_M: int = 128
    block_N: int = 64
    stages: int = 2
    B: int = 1
    H: int = 2
    dtype: torch.dtype = torch.float16
    explicit: bool = False          # examples/attention.py's ws_mha_fwd_program (BHSD only)
    schedule: str = "default"
    threads: int = 256              # the consumer's: 384 with block_M 192 (three warp groups)

    @property
    def shape(self):
        return (self.B, self.H, self.S, self.D) if self.layout == "bhsd" else (self.B, self.S, self.H, self.D)

    def prim(self):
        if self.explicit:
            assert self.layout == "bhsd"
            return ws_mha_fwd_program(self.B, self.H, self.S, self.D, self.causal, block_M=self.block_M,
                                      block_N=self.block_N, stages=self.stages, dtype=_T_DTYPES[self.dtype])
        return mha_fwd_program(self.B, self.H, self.S, self.D, self.causal, block_M=self.block_M,
                               block_N=self.block_N, num_stages=self.stages, threads=self.threads,
                               layout=self.layout, dtype=_T_DTYPES[self.dtype])

    def args(self, seed=0):
        q, k, v = (randn(*self.shape, dtype=self.dtype, seed=seed + s) for s in (1, 2, 3))
        return [q, k, v, torch.empty(self.shape, dtype=self.dtype)]

    def __str__(self):
        return (f"{'ws' if self.explicit else 'auto'}-{self.layout}-S{self.S}-D{self.D}-bn{self.block_N}-"
                f"st{self.stages}-{'causal' if self.causal else 'full'}-{str(self.dtype)[6:]}-{self.schedule}"
                + (f"-bm{self.block_M}-t{self.threads}" if self.threads != 256 else ""))


def sched(case: Att, schedule: str) -> Att:
    return dataclasses.replace(case, schedule=schedule)


@functools.lru_cache(maxsize=None)
def frontend(case: Att) -> ir.Kernel:
    return build_kernel(case.prim())


@functools.lru_cache(maxsize=None)
def lowered(case: Att) -> ir.Kernel:
    return lower(frontend(case), SCHEDULES[case.schedule])


@functools.lru_cache(maxsize=None)
def _reference(case: Att):
    args = case.args()
    want = run_interp(frontend(case), args, 3)
    assert not want.isnan().any(), "the reference left elements unwritten"
    err = rel_err(want, sdpa(*args[:3], case.causal, case.layout))
    assert err < 1e-2, f"{case}: rel err {err:.2e} vs SDPA"
    return args, want


def reference(case: Att):
    """(inputs, the frontend program's result), the result checked against float32 SDPA."""
    return _reference(dataclasses.replace(case, schedule="default"))


def assert_oracle(case: Att, kernel: ir.Kernel, seeds=SEEDS):
    """``kernel`` (a lowering of ``case``) equals the frontend program bit for bit under every
    seed; AssertionError naming the first differing seed otherwise."""
    args, want = reference(case)
    for seed in seeds:
        got = run_interp(kernel, args, 3, seed)
        assert torch.equal(got, want), f"{case} seed {seed}: after passes differs from before"


def base(name: str) -> str:
    """A fragment's program name: without the suffixes passes add (``_0``, ``_1``)."""
    return re.sub(r"(_\d+)+$", "", name)


def ws_roles(kernel: ir.Kernel) -> list:
    return [r for s in walk(kernel.body) if isinstance(s, ir.WarpSpecialize) for r in s.roles]


def consumers(kernel: ir.Kernel) -> list:
    return [r for r in ws_roles(kernel) if r.warpgroups != (0,)]


def role(kernel: ir.Kernel, groups: tuple) -> ir.Role:
    return next(r for r in ws_roles(kernel) if r.warpgroups == groups)


def main_loop(r: ir.Role) -> ir.For:
    return next(s for s in r.body.stmts if isinstance(s, ir.For))


def stores_to(p: ir.Stmt, name: str) -> bool:
    return any(isinstance(t, ir.Store) and base(t.buffer.name) == name for t in walk(p))


def reads(p: ir.Stmt, name: str) -> bool:
    return any(base(b.name) == name for t in walk(p) for b in buffers_read(t))


def qk_gemms(r: ir.Stmt) -> list:
    """S = Q K^T: the gemms reading both operands from shared memory."""
    return [s for s in walk(r) if isinstance(s, ir.Gemm) and s.a.buffer.scope is ir.Scope.SHARED]


def pv_gemms(r: ir.Stmt) -> list:
    """O += P V: the gemms reading their A operand (P) from registers."""
    return [s for s in walk(r) if isinstance(s, ir.Gemm) and s.a.buffer.scope is ir.Scope.FRAGMENT]


def fragments_of(r: ir.Role) -> dict:
    """The fragments role ``r`` touches, by name."""
    return {b.name: b for t in walk(r) for b in buffers_read(t) + buffers_written(t)
            if b.scope is ir.Scope.FRAGMENT}


# ----------------------------------------------------------------------------------------------
# a. the oracle: before == after the Hopper passes, under random schedules

ORACLE_CASES = [
    # 20 seeds: BHSD, causal and not, block_N 64 (S = 3 x 64 + 8) and 128 (S = 128 + 72)
    (Att(200, 64, True), SEEDS),
    (Att(200, 64, False), SEEDS),
    (Att(200, 64, True, block_N=128), SEEDS),
    (Att(100, 64, False, block_N=128), SEEDS),        # one partial K/V block
    # BSHD (the [B, S, H, D] views are 4-d TMA boxes), two batches
    (Att(200, 64, True, "bshd", B=2), range(8)),
    (Att(100, 64, False, "bshd", block_N=128, B=2), range(8)),
    # D 128, bf16, one and three stages
    (Att(200, 128, False), range(8)),
    (Att(200, 64, True, dtype=torch.bfloat16), range(8)),
    (Att(200, 64, True, stages=1), range(8)),
    (Att(328, 64, False, stages=3), range(8)),        # 6 K/V blocks: the 3-deep ring wraps
    # three consumer warp groups of 64 rows (block_M 192), each role with its own Q and O tiles
    (Att(200, 64, True, block_M=192, threads=384), SEEDS),
    (Att(400, 64, False, "bshd", block_M=192, block_N=128, threads=384, B=2), range(8)),
    # the other consumer schedules
    (Att(200, 64, True, schedule="split"), SEEDS),
    (Att(328, 64, False, stages=3, schedule="split"), range(8)),
    (Att(200, 64, True, schedule="merged"), SEEDS),
    (Att(200, 64, False, schedule="merged"), SEEDS),
    (Att(200, 64, True, schedule="overlap"), SEEDS),
    (Att(200, 64, False, schedule="overlap"), SEEDS),
    (Att(200, 128, True, "bshd", block_N=128, schedule="overlap"), range(8)),
    (Att(328, 64, True, stages=3, schedule="overlap"), range(8)),
    (Att(200, 64, True, schedule="pingpong"), range(8)),
    (Att(200, 128, False, "bshd", block_N=128, B=2, schedule="pingpong"), range(8)),
    # the explicit T.ws program
    (Att(200, 64, True, explicit=True), SEEDS),
    (Att(200, 64, False, explicit=True), SEEDS),
    (Att(200, 128, True, explicit=True, block_N=128), range(8)),
    (Att(328, 64, False, explicit=True, stages=3), range(8)),
    (Att(200, 64, True, explicit=True, stages=1), range(8)),
    (Att(200, 64, True, explicit=True, schedule="overlap"), range(8)),
]


@pytest.mark.parametrize("case, seeds", ORACLE_CASES, ids=[str(c) for c, _ in ORACLE_CASES])
def test_oracle_before_equals_after(case, seeds):
    after = lowered(case)
    assert after.find_plan(AsyncPlan) is not None, (after.notes, after.find_plan(AsyncRefusal))
    groups = case.threads // 128
    assert after.threads == 128 * (groups + 1)
    assert sorted(g for r in consumers(after) for g in r.warpgroups) == list(range(1, groups + 1))
    assert_oracle(case, after, seeds)


# ----------------------------------------------------------------------------------------------
# b. structure of the lowered IR


STRUCTURE = [Att(200, 64, True), Att(200, 128, False, block_N=128), Att(200, 64, True, "bshd", B=2),
             Att(200, 64, False, stages=1), Att(200, 64, True, schedule="merged"),
             Att(200, 128, False, block_N=128, schedule="merged"), Att(200, 64, True, schedule="overlap"),
             Att(200, 64, True, schedule="split"), Att(200, 64, False, stages=1, schedule="split"),
             Att(200, 64, True, explicit=True), Att(200, 64, True, explicit=True, schedule="overlap"),
             Att(200, 64, True, schedule="pingpong"), Att(200, 128, False, block_N=128, schedule="pingpong")]


@pytest.mark.parametrize("case", STRUCTURE, ids=str)
def test_lowered_structure(case):
    k = lowered(case)
    plan = k.plan(AsyncPlan)
    assert k.find_plan(AsyncRefusal) is None
    roles = ws_roles(k)
    cons = consumers(k)
    assert len([s for s in walk(k.body) if isinstance(s, ir.WarpSpecialize)]) == 1
    assert roles[0].warpgroups == (0,)
    if case.explicit:                                          # the roles as written
        written = [r.warpgroups for r in walk(frontend(case).body) if isinstance(r, ir.Role)]
        assert [r.warpgroups for r in cons] == [g for g in dict.fromkeys(written) if g != (0,)]
    elif case.schedule == "merged":
        assert [r.warpgroups for r in cons] == [(1, 2)]       # docs/ws-semantics.md #2
    else:
        assert [r.warpgroups for r in cons] in ([(1, 2)], [(1,), (2,)])
    producer = roles[0]
    assert (producer.num_warps, producer.num_regs) == (1, 24)
    assert plan.default_role == cons[0].warpgroups
    for r in cons:
        assert r.num_warps == 4 * len(r.warpgroups) and r.num_regs >= 232
    assert sum(128 * len(r.warpgroups) * r.num_regs for r in roles) <= 65536     # the register file
    # the producer: Q by TMA once, before its loop, completing on its barrier; K and V in the loop
    p_loop = main_loop(producer)
    top = producer.body.stmts
    q_loads = [s for s in walk(producer) if isinstance(s, ir.Copy) and s.src.buffer.name == "Q"]
    assert len(q_loads) == 1 and q_loads[0] in top and top.index(q_loads[0]) < top.index(p_loop)
    q_bar = q_loads[0].barrier.buffer.name
    assert q_loads[0].mechanism is ir.CopyMechanism.TMA and q_bar == ("q_ready" if case.explicit else "preloaded")
    assert q_loads[0].dst.extents == (case.block_M, case.D)
    loop_loads = [s for s in walk(p_loop) if isinstance(s, ir.Copy)]
    assert sorted(s.src.buffer.name for s in loop_loads) == ["K", "V"]
    # K and V on rings of their own — the explicit program's barriers, or warp_specialize's:
    # the consumer waits for K right before Q K^T and for V right before P V, and releases each
    # after a wait that covers its gemm
    full = {"K": "k_full", "V": "v_full"} if case.explicit else {"K": "full_K_shared", "V": "full_V_shared"}
    empty = {"K": "k_empty", "V": "v_empty"} if case.explicit else {"K": "empty_K_shared", "V": "empty_V_shared"}
    assert all(s.mechanism is ir.CopyMechanism.TMA and s.barrier.buffer.name == full[s.src.buffer.name]
               for s in loop_loads)
    # the ring: the program's stages, at least two in warp_specialize's own (they fit here)
    stages = case.stages if case.explicit else max(case.stages, warp_specialize.MIN_RING_STAGES)
    if not case.explicit:
        pipe = k.plan(PipelinePlan)
        assert pipe.preloads and set(pipe.ring_buffers) == {"K_shared", "V_shared"}
        assert pipe.stages == stages
    # each consumer's first wait is on Q's barrier (parity 0), at its top level, before anything
    # reads Q (docs/ws-semantics.md #9); only consumers wait on it
    q_shared = q_loads[0].dst.buffer.name
    for r in cons:
        first_wait = next(s for s in walk(r) if isinstance(s, ir.BarrierWait))
        assert first_wait.barrier.buffer.name == q_bar and ir.as_int(first_wait.parity) == 0
        assert first_wait in r.body.stmts
        assert not any(reads(s, q_shared) for s in r.body.stmts[:r.body.stmts.index(first_wait)])
    assert not any(isinstance(s, ir.BarrierWait) and s.barrier.buffer.name == q_bar for s in walk(producer))
    # barriers: one arrival (the TMA's expect) per phase of Q's and the full ones; an empty one
    # completes when both consumer warp groups (256 threads: every consumer role) released a stage
    # (split consumers take turns issuing their gemms: one arrival per phase of each 'turns' barrier)
    counts = dict(plan.barrier_counts)
    turns = {"turns": (1,) * len(cons)} if (len(cons) > 1 and SCHEDULES[case.schedule].policy.pingpong
                                            and not case.explicit) else {}
    assert counts == {q_bar: (1,), **{full[x]: (1,) * stages for x in "KV"},
                      **{empty[x]: (len(cons),) * stages for x in "KV"}, **turns}
    allocs = {s.buffer.name: s.buffer for s in walk(k.body) if isinstance(s, ir.Alloc)}
    assert all(allocs[empty[x]].arrive_counts == (256,) * stages for x in "KV")
    ring_of = {v: x for x, v in full.items()}
    for r in cons:
        body = main_loop(r).body.stmts
        waits = [i for i, s in enumerate(body) if isinstance(s, ir.BarrierWait)
                 and s.barrier.buffer.name not in turns]
        assert [body[i].barrier.buffer.name for i in waits] == [full["K"], full["V"]]
        for i in waits:
            g = body[i + 1 + (body[i + 1].barrier.buffer.name in turns if isinstance(body[i + 1], ir.BarrierWait) else 0)]
            assert isinstance(g, ir.Gemm) and g.b.buffer.name.startswith(ring_of[body[i].barrier.buffer.name])
        arrives = [i for i, s in enumerate(body) if isinstance(s, ir.BarrierArrive)
                   and s.barrier.buffer.name not in turns]
        assert sorted(body[i].barrier.buffer.name for i in arrives) == [empty["K"], empty["V"]]
        assert all(isinstance(body[i - 1], ir.GemmWait) for i in arrives)
    # the gemms of each consumer: S = Q K^T from shared memory, O += P V with P in registers, as
    # many of one as of the other (an overlapping schedule peels an iteration), all wgmma
    for r in cons:
        qk, pv = qk_gemms(r), pv_gemms(r)
        assert len(qk) == len(pv) >= 1 and len(qk) + len(pv) == sum(isinstance(s, ir.Gemm) for s in walk(r))
        assert all(g.a.buffer.name == q_shared and g.b.buffer.name.startswith("K") and g.transpose_b for g in qk)
        assert all(g.b.buffer.name.startswith("V") and g.a.buffer.dtype == g.b.buffer.dtype for g in pv)
        assert all(g.instr is ir.GemmInstr.WGMMA for g in qk + pv)
        if not SCHEDULES[case.schedule].policy.overlap_softmax:
            assert len(pv) == 1
        # the epilogue: registers -> shared, fence, TMA store of this role's rows, wait
        kinds = [type(s).__name__ for s in r.body.stmts[-4:]]
        assert kinds == ["Copy", "ProxyFence", "Copy", "BulkStoreWait"], kinds
        store = r.body.stmts[-2]
        assert store.mechanism is ir.CopyMechanism.TMA and store.dst.buffer.name == "Output"
    verify_async.run(k)             # every wgmma waited for before its results or operands are reused
    # the layout plan: per consumer role of G warp groups holding R rows
    lp = k.plan(LayoutPlan)
    rows = case.block_M // len(cons)
    for r in cons:
        G = len(r.warpgroups)
        frags = fragments_of(r)
        qk, pv = qk_gemms(r), pv_gemms(r)
        s_lay = layouts.WgmmaAccumulator((4 * G, 1), (16, case.block_N, 16))     # M over the groups
        o_lay = layouts.WgmmaAccumulator((4 * G, 1), (16, case.D, 16))
        # S, P, O and five row vectors
        assert len(frags) == 8
        for name, b in frags.items():
            assert b.static_shape[0] == rows, name             # each role holds its own rows
            shape, f32 = b.static_shape, b.dtype is ir.DType.F32
            if shape == (rows, case.block_N) and f32:           # S (and a copy of it)
                assert lp.of(name) == s_lay, name
            elif shape == (rows, case.block_N):                 # P: the register A operand of P V
                assert lp.of(name) == layouts.WgmmaOperandA(o_lay, 2), name
            elif shape == (rows, case.D):                       # O
                assert f32 and lp.of(name) == o_lay, name
            else:                                               # row max, sums, rescale factor
                assert len(shape) == 1 and lp.of(name) == layouts.RowSlice(1, s_lay), name
        assert {g.c.buffer.name for g in qk} <= {n for n in frags if lp.of(n) == s_lay}
        assert {g.c.buffer.name for g in pv} <= {n for n in frags if lp.of(n) == o_lay}
        assert all(lp.of(g.a.buffer.name) == layouts.WgmmaOperandA(o_lay, 2) for g in pv)
        # P converts in place: the thread holding S[i, k] holds operand element (i, k) of P V
        a = layouts.WgmmaOperandA(o_lay, 2)
        for i in range(0, rows, 3):
            for kk in range(case.block_N):
                assert layouts.element_to_thread(s_lay, rows, case.block_N, i, kk)[0] == \
                    layouts.operand_a_to_thread(a, rows, case.block_N, i, kk)
        # every T.Parallel has a frame: the layout of the fragment it stores whole; a rescale of
        # O reads the factor (kept in S's row slice, the first layout it got) in O's frame
        frames = dict(lp.frames)
        pars = [s for s in walk(r) if isinstance(s, ir.Parallel)]
        assert len({p.vars[0].name for p in pars}) == (7 if case.explicit else 8)   # + 1 / row sums
        for p in pars:
            stored = {t.buffer.name for t in walk(p) if isinstance(t, ir.Store)}
            assert len(stored) == 1
            name = stored.pop()
            assert frames[p.vars[0].name] == lp.of(name), (p.vars[0].name, name)
            if len(p.vars) == 1:
                assert frames[p.vars[0].name] == layouts.RowSlice(1, s_lay)
            o_names = {g.c.buffer.name for g in pv}
            if name in o_names and any(len(frags[b.name].static_shape) == 1 for t in walk(p)
                                        for b in buffers_read(t) if b.name in frags):
                assert frames[p.vars[0].name] == o_lay           # O's rescale / normalisation
    for name in ("Q", "K", "V", "O"):
        shared = next(n for n, b in allocs.items() if b.scope is ir.Scope.SHARED and n.startswith(name))
        assert lp.of(shared) == layouts.NVMMAShared(128, 16), shared
    # shared memory: Q, the K/V ring, O and the barriers, disjoint within the budget, except that
    # O (written after the loop) may take the bytes of Q (handed over before it)
    smem = k.plan(SharedMemoryPlan)
    row = case.D * 2
    assert all(later.startswith("O") and earlier.startswith("Q") for later, earlier in smem.reuses)
    assert smem.total_bytes == ((2 - len(smem.reuses)) * case.block_M
                                + 2 * stages * case.block_N) * row + \
        8 * (1 + 4 * stages + len(turns.get("turns", ())))   # Q's barrier; K's and V's
    #                                                                   full/empty pairs; turns
    shared = {frozenset(p) for p in smem.reuses}
    spans = sorted((off, off + n, name) for name, off, n in smem.ranges)
    assert all(a_end <= b_start or frozenset((a, b)) in shared
               for (_, a_end, a), (b_start, _, b) in zip(spans, spans[1:]))


# ----------------------------------------------------------------------------------------------
# c. compile-only sm_90a builds


COMPILED = {
    "d64_causal_bhsd": Att(1000, 64, True, block_N=128, B=2, H=4),
    "d128_full_bhsd_merged": Att(1000, 128, False, block_N=128, B=2, H=4, schedule="merged"),
    "d64_full_bshd_bf16": Att(1000, 64, False, "bshd", block_N=128, B=2, H=4, dtype=torch.bfloat16),
    "explicit_d128_causal_bn64": Att(1000, 128, True, block_N=64, B=2, H=4, explicit=True),
}


@functools.lru_cache(maxsize=None)
def compiled(name: str):
    k = lowered(COMPILED[name])
    assert k.find_plan(AsyncPlan) is not None
    return gluon_program(k)


def count(pattern: str, text: str) -> int:
    return len(re.findall(pattern, text))


@pytest.mark.parametrize("name", sorted(COMPILED))
def test_compiled_attention(name):
    c, p = COMPILED[name], compiled(name)
    k = lowered(c)
    ttgir, ptx, src = p.asm["ttgir"], p.asm["ptx"], p.source
    t = "f16" if c.dtype == torch.float16 else "bf16"
    bm, bn, D = c.block_M, c.block_N, c.D
    plan = k.plan(AsyncPlan)
    roles = ws_roles(k)
    default = next(r for r in roles if r.warpgroups == plan.default_role)
    workers = [r for r in roles if r is not default]
    # no fallback: the Gluon source, one warp_specialize; the default partition has the warps
    # and registers legalize gave its role, each worker partition those of its role
    assert "from triton.experimental import gluon" in src and "import triton.language" not in src
    assert count(r"gl\.warp_specialize\(", src) == 1
    assert count(r"ttg\.warp_specialize\(", ttgir) == 1
    assert sorted(re.findall(r"partition\d+\(.*\) num_warps\((\d+)\)", ttgir)) == \
        sorted(str(r.num_warps) for r in workers)
    assert f'"ttg.num-warps" = {default.num_warps} : i32' in ttgir
    assert re.search(rf"setmaxnreg\.inc\.sync\.aligned\.u32\s+{default.num_regs};", ptx)
    for r in workers:
        assert re.search(rf"setmaxnreg\.(inc|dec)\.sync\.aligned\.u32\s+{r.num_regs};", ptx), r.warpgroups
    if c.schedule == "merged":
        assert (default.warpgroups, default.num_warps, default.num_regs) == ((1, 2), 8, 240)
    # TMA loads: Q once before the producer's loop, then K and V in it
    producer = ttgir[ttgir.index("partition0("):] if workers[0].warpgroups == (0,) else None
    assert producer is not None, "the producer is the first worker partition"
    producer = producer[:producer.index("partition1(")] if "partition1(" in producer else producer
    loads = [m.start() for m in re.finditer(r"ttng\.async_tma_copy_global_to_local", producer)]
    assert len(loads) == 3 and count(r"ttng\.async_tma_copy_global_to_local", ttgir) == 3
    assert loads[0] < producer.index("scf.for") < loads[1]
    for d in ("Q", "K", "V"):
        assert count(rf"tma\.async_copy_global_to_shared\({d}_desc_0,", src) == 1, d
    load = r"cp\.async\.bulk\.tensor\.4d\.shared::cluster\.global\.mbarrier::complete_tx::bytes"
    # a 128-byte swizzle caps a box row at 128 bytes: Triton splits wider tiles (D = 128) in two
    assert count(load, ptx) == 3 * max(1, D * 2 // 128)
    # expect bytes: Q's tile on its barrier, K's and V's each on its own ring's
    rings = [bn * D * 2, bn * D * 2]
    assert sorted(int(b) for b in re.findall(r"ttng\.barrier_expect %\w+, (\d+)", ttgir)) == \
        sorted([bm * D * 2, *rings])
    # ... plus one per split consumer role taking turns (pingpong)
    taking_turns = k.find_plan(ConsumerSplit) is not None and SCHEDULES[c.schedule].policy.pingpong
    turns = len(consumers(k)) if taking_turns else 0
    assert count(r"mbarrier\.init\.shared::cta\.b64", ptx) == 1 + 2 * len(rings) * c.stages + turns
    # the deferred P V (overlap_softmax): Q K^T of block k completes while P V of block k - 1 is
    # still in flight (wait for all but one), then P V (wait for none)
    deferred = SCHEDULES[c.schedule].policy.overlap_softmax
    assert bool(re.search(r"wgmma\.wait_group\.sync\.aligned\s+1;", ptx)) == deferred
    # wgmma: a consumer role of G warp groups computes its R rows as R / (64 G) 64-row slabs per
    # warp group, and the PTX holds one program text per role (every warp group of the role runs
    # it). So per role, for each gemm statement of the lowered IR (a schedule may peel an
    # iteration, so a gemm can appear more than once):
    #   S = Q K^T  (R x bn, reduction D):  R / (64 G) * D / 16 instructions m64n{bn}k16
    #   O += P V   (R x D,  reduction bn): R / (64 G) * bn / 16 instructions m64n{D}k16
    # (one instruction spans a whole N <= 256; the loop over K/V blocks is not unrolled). With
    # the merged consumer (one role, G = 2, R = 128) and one gemm of each: D / 16 m64n{bn}k16
    # and bn / 16 m64n{D}k16.
    want = collections.Counter()
    n_qk = n_pv = 0
    for r in consumers(k):
        G = len(r.warpgroups)
        for g in qk_gemms(r) + pv_gemms(r):
            M, N = g.c.tile_shape
            K = g.a.tile_shape[-1]
            assert M % (64 * G) == 0
            want[f"m64n{N}k16"] += M // (64 * G) * K // 16
        n_qk += len(qk_gemms(r))
        n_pv += len(pv_gemms(r))
    assert n_qk == n_pv >= len(consumers(k))
    if c.schedule == "merged":
        assert want == collections.Counter({f"m64n{bn}k16": D // 16}) + collections.Counter({f"m64n{D}k16": bn // 16})
    got = collections.Counter(re.findall(rf"wgmma\.mma_async\.sync\.aligned\.(m64n\d+k16)\.f32\.{t}\.{t}", ptx))
    assert got == want and count(r"wgmma\.mma_async", ptx) == sum(want.values())
    assert re.search(r"wgmma\.wait_group\.sync\.aligned\s+0;", ptx)
    # the warp_group_dots: S from two shared operands; P V with P in registers (dot_op, opIdx 0,
    # parent = O's accumulator layout)
    dots = re.findall(r"ttng\.warp_group_dot %[^\n]*", ttgir)
    shared_dots = [d for d in dots if re.search(rf": !ttg\.memdesc<\d+x{D}x{t}, [^>]*> \* "
                                                rf"!ttg\.memdesc<{D}x{bn}x{t}, ", d)]
    reg_dots = [re.search(rf": tensor<(\d+)x{bn}x{t}, #ttg\.dot_op<\{{opIdx = 0, parent = (#mma\d*), "
                          rf"kWidth = 2\}}>> \* !ttg\.memdesc<{bn}x{D}x{t}, [^>]*> -> "
                          rf"tensor<(\d+)x{D}xf32, (#mma\d*)>", d) for d in dots]
    reg_dots = [m for m in reg_dots if m]
    assert len(dots) == n_qk + n_pv and len(shared_dots) == n_qk and len(reg_dots) == n_pv, dots
    assert all(m.group(1) == m.group(3) and m.group(2) == m.group(4) for m in reg_dots)
    # P reaches its operand layout by a register conversion, not through shared memory: the only
    # shared allocations are the kernel's tiles and barrier arrays, and the only register ->
    # shared stores are O's epilogues
    assert re.search(rf"ttg\.convert_layout %\S+ : tensor<\d+x{bn}x{t}, #mma\d*> -> "
                     rf"tensor<\d+x{bn}x{t}, #ttg\.dot_op<\{{opIdx = 0", ttgir)
    smem_allocs = [s for s in walk(k.body) if isinstance(s, ir.Alloc)
                   and s.buffer.scope in (ir.Scope.SHARED, ir.Scope.BARRIER)]
    # Q, K, V, O tiles; Q's barrier; full/empty pairs; turns
    assert len(smem_allocs) == 5 + 2 * len(rings) + bool(turns)
    groups = k.plan(SharedMemoryPlan).reused()     # buffers sharing bytes: one arena per group
    assert count(r"ttg\.local_alloc", ttgir) == len(smem_allocs) - sum(len(g) - 1 for *_, g in groups)
    epilogues = [s for s in walk(k.body) if isinstance(s, ir.Copy) and s.src.buffer.scope is ir.Scope.FRAGMENT
                 and s.dst.buffer.scope is ir.Scope.SHARED]
    assert len(epilogues) == len(consumers(k))
    assert count(r"ttg\.local_load", ttgir) == 0 and count(r"ttg\.local_store", ttgir) == len(epilogues)
    assert count(r"\b(ld|st)\.local\b", ptx) == 0, "the kernel spills registers"
    # the epilogue: fence the ordinary stores to O's staging tile, then the TMA store, then wait
    store = re.search(r"cp\.async\.bulk\.tensor\.4d\.global\.shared::cta\.bulk_group", ptx)
    fence = [m.start() for m in re.finditer(r"fence\.proxy\.async\.shared::cta", ptx)]
    assert store and fence and min(fence) < store.start()
    assert count(r"ttng\.async_tma_copy_local_to_global", ttgir) == len(epilogues)
    assert re.search(r"cp\.async\.bulk\.wait_group\.read\s+0;", ptx)
    assert k.plan(SharedMemoryPlan).total_bytes <= p.metadata["shared"] <= HOPPER.caps.smem_bytes


# ----------------------------------------------------------------------------------------------
# d. wrong lowerings that must be caught


WRONG = {s: Att(200, 64, True, schedule=s) for s in SCHEDULES}   # 4 K/V blocks: the max moves


def without(kernel: ir.Kernel, doomed: list) -> ir.Kernel:
    """``kernel`` without the statements ``doomed`` (by identity)."""
    return transform(kernel, lambda n: dataclasses.replace(n, stmts=tuple(
        t for t in n.stmts if not any(t is d for d in doomed)))
        if isinstance(n, ir.Seq) and any(t is d for t in n.stmts for d in doomed) else None)


@pytest.mark.parametrize("schedule", sorted(SCHEDULES))
def test_missing_rescale_of_the_output_is_caught(schedule):
    case = WRONG[schedule]
    ours = lowered(case)
    rescale = [p for r in consumers(ours) for p in walk(r) if isinstance(p, ir.Parallel)
               and stores_to(p, "acc_o") and reads(p, "scores_scale")]
    assert len(rescale) >= len(consumers(ours))
    wrong = without(ours, rescale)
    pars = lambda k: sum(isinstance(s, ir.Parallel) for s in walk(k.body))   # noqa: E731
    assert pars(wrong) == pars(ours) - len(rescale)
    verify.run(wrong)                     # well-formed: only the numbers are wrong
    verify_async.run(wrong)
    assert_oracle(case, ours, range(3))
    with pytest.raises(AssertionError, match="after passes differs from before"):
        assert_oracle(case, wrong, range(3))
    args, _ = reference(case)
    assert rel_err(run_interp(wrong, args, 3), sdpa(*args[:3], True)) > 0.05


@pytest.mark.parametrize("schedule", sorted(SCHEDULES))
def test_p_cast_before_the_exp_is_caught(schedule):
    # P V must read exp(S - max); a lowering that casts S to P before the exponential (moving
    # the cast above the exp T.Parallel in each block's code) multiplies V by the raw scores
    case = WRONG[schedule]
    ours = lowered(case)
    moved = 0

    def cast_early(n):
        nonlocal moved
        if not isinstance(n, ir.Seq):
            return None
        casts = [t for t in n.stmts if isinstance(t, ir.Copy) and base(t.dst.buffer.name) == "acc_s_cast"]
        exps = [t for t in n.stmts if isinstance(t, ir.Parallel) and len(t.vars) == 2
                and reads(t, "scores_max") and stores_to(t, "acc_s")]
        if len(casts) != 1 or len(exps) != 1:
            return None
        rest = [t for t in n.stmts if t is not casts[0]]
        at = next(i for i, t in enumerate(rest) if t is exps[0])
        moved += 1
        return dataclasses.replace(n, stmts=tuple(rest[:at] + [casts[0]] + rest[at:]))
    wrong = transform(ours, cast_early)
    assert moved >= len(consumers(ours))
    verify.run(wrong)
    # overlap_softmax casts block k's P at the top of the next iteration: moved below that
    # iteration's P V, the first P V reads P before any cast (the interpreter refuses the read)
    with pytest.raises((AssertionError, UninitializedReadError),
                       match="after passes differs from before|uninitialized fragment buffer 'acc_s_cast"):
        assert_oracle(case, wrong, range(2))


@pytest.mark.parametrize("which", ["causal", "sequence_end"])
def test_dropped_mask_is_caught(which):
    # causal: rows see keys after their position; sequence_end (non-causal, S ragged): the
    # zero-filled keys past S get weight exp(0 - max) in the softmax
    case = Att(200, 64, which == "causal")
    ours = lowered(case)
    changed = []

    def unmask(n):
        if not isinstance(n, ir.Select):
            return None
        assert isinstance(n.cond, ir.Cmp)
        assert which == "causal" or ir.as_int(n.cond.b) == case.S
        changed.append(n)
        return n.a                           # 0 everywhere
    masks = [p for r in consumers(ours) for p in walk(r) if isinstance(p, ir.Parallel) and stores_to(p, "acc_s")
             and any(isinstance(s, ir.Store) and isinstance(s.value, ir.Select) for s in walk(p))]
    assert len(masks) >= len(consumers(ours))
    wrong = transform(ours, lambda n: transform(n, unmask) if any(n is m for m in masks) else None)
    assert len(changed) == len(masks)
    with pytest.raises(AssertionError, match="after passes differs from before"):
        assert_oracle(case, wrong, range(2))


@pytest.mark.parametrize("schedule", sorted(SCHEDULES))
def test_consumer_not_waiting_for_the_preloaded_q_is_caught(schedule):
    # docs/ws-semantics.md #9: a copy made before the loop (Q) must be waited for by the consumer
    case = WRONG[schedule]
    ours = lowered(case)
    for r in consumers(ours):
        waits = [s for s in walk(r) if isinstance(s, ir.BarrierWait) and s.barrier.buffer.name == "preloaded"]
        assert len(waits) == 1
        wrong = without(ours, waits)
        args, _ = reference(case)
        with pytest.raises((RaceError, UninitializedReadError, DeadlockError), match="Q_shared"):
            for seed in SEEDS:
                run_interp(wrong, args, 3, seed)


# ----------------------------------------------------------------------------------------------
# e. tilews.ops.attention: arguments, empty sequences, fallback, CPU numerics


def qkv(shape, dtype=torch.float16, seed=0):
    return tuple(randn(*shape, dtype=dtype, seed=seed + s) for s in range(3))


def test_mismatched_arguments_name_the_parameter():
    q, k, v = qkv((1, 2, 16, 64))
    with pytest.raises(ValueError, match=r"'k' has shape \(1, 2, 17, 64\) but 'q' has \(1, 2, 16, 64\)"):
        attention(q, randn(1, 2, 17, 64, dtype=torch.float16), v)
    with pytest.raises(ValueError, match=r"'v' has shape \(1, 2, 16, 32\)"):
        attention(q, k, randn(1, 2, 16, 32, dtype=torch.float16))
    with pytest.raises(TypeError, match=r"'k' is torch\.bfloat16 but 'q' is torch\.float16"):
        attention(q, k.bfloat16(), v)
    with pytest.raises(TypeError, match=r"'v' is torch\.bfloat16 but 'q' is torch\.float16"):
        attention(q, k, v.bfloat16())
    with pytest.raises(ValueError, match=r"'q' must be 4-d \(bhsd\), got shape \(2, 16, 64\)"):
        attention(q[0], k, v)
    with pytest.raises(ValueError, match=r"'v' must be 4-d \(bshd\)"):
        attention(q, k, v[..., None], layout="bshd")
    with pytest.raises(TypeError, match="'q' must be float16 or bfloat16, got torch.float32"):
        attention(q.float(), k.float(), v.float())
    with pytest.raises(TypeError, match="'k' must be float16 or bfloat16, got torch.float32"):
        attention(q, k.float(), v)
    with pytest.raises(TypeError, match="'v' must be a torch.Tensor, got list"):
        attention(q, k, [1.0])
    with pytest.raises(ValueError, match=r"layout=\.\.\.\) must be 'bhsd' or 'bshd', got 'bsdh'"):
        attention(q, k, v, layout="bsdh")
    with pytest.raises(ValueError, match="layout must be 'bhsd' or 'bshd', got 'BHSD'"):
        mha_fwd_program(1, 2, 16, 64, False, layout="BHSD")


@pytest.mark.parametrize("layout", ["bhsd", "bshd"])
@pytest.mark.parametrize("shape", [(2, 3, 0, 64), (0, 3, 5, 64), (2, 0, 5, 64)])
def test_empty_inputs_give_an_empty_result(shape, layout):
    if layout == "bshd":
        shape = (shape[0], shape[2], shape[1], shape[3])
    q, k, v = (torch.empty(shape, dtype=torch.float16) for _ in range(3))
    out = attention(q, k, v, is_causal=True, layout=layout)
    assert out.shape == shape and out.dtype == torch.float16 and out.numel() == 0


def test_hopper_falls_back_for_a_head_dim_wgmma_cannot_take():
    # D = 8: the QK^T reduction is shorter than wgmma's k step (16 for fp16); triton.language
    # (tl.dot) takes it, so target "hopper" compiles through the fallback and says why
    k = tilews.jit(out_idx=[3], target="hopper")(mha_fwd_program)(1, 2, 64, 8, True, block_M=64,
                                                                   block_N=64, threads=128)
    assert k.target == "hopper -> triton" and k.report.backend == "tl"
    assert any(n.startswith("hopper: the gluon backend refused the program (the reduction dim of "
                            "T.gemm at line") and "is 8, not a multiple of wgmma's k step 16 for f16" in n
               and n.endswith("; using tl") for n in k.report.notes), k.report.notes
    q, kk, v = qkv((1, 2, 64, 8), seed=40)
    out = k(q, kk, v)
    assert rel_err(out, sdpa(q, kk, v, True)) < 1e-2


def test_head_dim_wgmma_cannot_take_falls_back_to_padded_tensors():
    # D = 40: not a multiple of wgmma's k step, nor a power of two; triton.language holds the
    # head dim in tensors of 64 (the padding zero), so target "hopper" runs it through the fallback
    k = tilews.jit(out_idx=[3], target="hopper")(mha_fwd_program)(1, 2, 128, 40, False, block_M=64,
                                                                   block_N=64, threads=128)
    assert k.target == "hopper -> triton" and k.report.backend == "tl"
    assert any("is 40, not a multiple of wgmma's k step 16" in n for n in k.report.notes), k.report.notes
    q, kk, v = qkv((1, 2, 128, 40), seed=60)
    assert rel_err(k(q, kk, v), sdpa(q, kk, v, False)) < 1e-2


def test_block_m_64_with_two_consumer_groups_splits_n():
    # block_M = 64 cannot give each of two warp groups 64 rows; the valid partition (#3) is
    # (4, 2): both groups share the rows and split the columns. The program stays on Gluon
    k = lower(build_kernel(mha_fwd_program(1, 2, 128, 64, False, block_M=64, block_N=64, threads=256)), HOPPER)
    assert k.find_plan(AsyncPlan) is not None
    lp = k.plan(LayoutPlan)
    assert lp.of("acc_s").warps_per_cta == (4, 2) and lp.of("acc_o").warps_per_cta == (4, 2)
    assert layouts.warp_partition_ok(4, 2, 8, 64, 64)


def test_block_m_without_a_wgmma_partition_falls_back():
    # block_M = 32 with one consumer warp group: M is not a multiple of 64 per warp group, so
    # no wgmma warp partition exists (docs/ws-semantics.md #3). The accumulator must get no
    # wgmma layout and legalize_wgmma must refuse, naming the gemm, so target "hopper" falls back
    # to triton.language. (Once a bug: infer_layouts gave the accumulator a Blocked layout, the
    # refusal looked only for a missing layout, and Triton aborted compiling the Gluon source.)
    k = lower(build_kernel(mha_fwd_program(1, 2, 128, 64, False, block_M=32, block_N=64, threads=128)), HOPPER)
    assert not isinstance(k.plan(LayoutPlan).of("acc_s"), layouts.WgmmaAccumulator)
    assert k.find_plan(AsyncPlan) is None
    assert re.fullmatch(r"no wgmma warp partition fits the 32x64 tile of T\.gemm at line \d+: block_M must be "
                        r"a multiple of 64 per consumer warp group and block_N of 8", k.plan(AsyncRefusal).reason)
    kernel = tilews.jit(out_idx=[3], target="hopper")(mha_fwd_program)(1, 2, 64, 64, True, block_M=32,
                                                                        block_N=32, threads=128)
    assert kernel.target == "hopper -> triton"
    assert any("no wgmma warp partition fits the 32x32 tile" in n and n.endswith("; using tl")
               for n in kernel.report.notes), kernel.report.notes
    q, kk, v = qkv((1, 2, 64, 64), seed=50)
    assert rel_err(kernel(q, kk, v), sdpa(q, kk, v, True)) < 1e-2


def test_tiles_triton_cannot_allocate_fall_back_with_the_reason():
    # Triton's shared layouts and TMA descriptors take power-of-two tiles: a 192-row Q tile is
    # refused where one role holds it (three warp groups merged in one role, also no power of
    # two of warps); it once aborted inside Triton. A GEMM's 48-column B tile, once refused too,
    # is cut into 32 + 16 columns (split_extents) and stays on the Gluon path
    merged = lower(build_kernel(mha_fwd_program(1, 2, 200, 64, False, block_M=192, block_N=128,
                                                threads=384)), SCHEDULES["merged"])
    assert "shared buffer 'Q_shared' is a [192, 64] tile" in merged.plan(AsyncRefusal).reason
    split = lower(build_kernel(mha_fwd_program(1, 2, 200, 64, False, block_M=192, block_N=128,
                                               threads=384)), HOPPER)
    assert {b.name: b.static_shape for s in split.body.stmts if isinstance(s, ir.Alloc)
            for b in [s.buffer] if b.name.startswith(("Q_shared", "O_shared"))} == \
        {f"{n}_shared_{h}": (64, 64) for n in "QO" for h in range(3)}
    plan = split.plan(AsyncPlan)
    assert plan.num_warps == 4 and sorted(r.num_regs for r in consumers(split)) == [160, 160, 168]
    k = lower(build_kernel(fragment_program(64, 48, 1, 0, "sum")), HOPPER)
    assert k.find_plan(AsyncPlan) is not None
    assert "split_extents: cut into power-of-two pieces: B_s (32 + 16), acc (32 + 16), col (32 + 16), " \
        "red (32 + 16), twin (32 + 16)" in k.notes


NUMERICS = [
    (100, True, "bhsd", torch.float16),
    (100, False, "bhsd", torch.float16),
    (130, True, "bshd", torch.float16),
    (130, False, "bshd", torch.float16),
    (100, True, "bhsd", torch.bfloat16),
    (130, False, "bshd", torch.bfloat16),
    (1, True, "bhsd", torch.float16),          # one query, one key
]


@pytest.mark.parametrize("S, causal, layout, dtype", NUMERICS)
def test_attention_op_on_the_cpu(S, causal, layout, dtype):
    B, H, D = 2, 2, 64
    shape = (B, H, S, D) if layout == "bhsd" else (B, S, H, D)
    q, k, v = qkv(shape, dtype, seed=S)
    out = attention(q, k, v, is_causal=causal, layout=layout)
    assert out.shape == shape and out.dtype == dtype and not out.isnan().any()
    want = sdpa(q, k, v, causal, layout)
    assert rel_err(out, want) < 1e-2
    # the mask matters (so the check can tell causal from not)
    other = sdpa(q, k, v, not causal, layout)
    assert S == 1 or rel_err(out, other) > 0.05


# ----------------------------------------------------------------------------------------------
# f. infer_layouts' fragment rules on generated programs


def fragment_program(M, N, groups, reduce_dim, reduce_kind):
    """A GEMM into ``acc`` followed by fragment math that exercises each layout rule."""
    K, bk = 64, 32
    red_shape = (M,) if reduce_dim == 1 else (N,)
    reduce = T.reduce_max if reduce_kind == "max" else T.reduce_sum

    @T.prim_func
    def main(A: T.Tensor((M, K), T.float16), B: T.Tensor((K, N), T.float16), C: T.Tensor((M, N), T.float16)):
        with T.Kernel(1, threads=128 * groups) as bx:
            A_s = T.alloc_shared((M, bk), T.float16)
            B_s = T.alloc_shared((bk, N), T.float16)
            acc = T.alloc_fragment((M, N), T.float32)
            red = T.alloc_fragment(red_shape, T.float32)
            row = T.alloc_fragment((M,), T.float32)
            col = T.alloc_fragment((N,), T.float32)
            twin = T.alloc_fragment((M, N), T.float32)
            free = T.alloc_fragment((M,), T.float32)
            T.clear(acc)
            T.fill(row, 1.0)
            T.fill(col, 2.0)
            T.fill(free, 3.0)
            for k in T.Pipelined(T.ceildiv(K, bk), num_stages=2):
                T.copy(A[0, k * bk], A_s)
                T.copy(B[k * bk, 0], B_s)
                T.gemm(A_s, B_s, acc)
            reduce(acc, red, dim=reduce_dim)
            for i, j in T.Parallel(M, N):
                acc[i, j] = acc[i, j] * row[i] + col[j]
            T.copy(acc, twin)
            for i in T.Parallel(M):
                free[i] = free[i] + 1.0
            T.copy(twin, C[0, 0])
    return main


@settings(max_examples=16, deadline=None)
@given(st.sampled_from([1, 2]), st.sampled_from([1, 2]), st.sampled_from([1, 2, 4, 8]), st.sampled_from([0, 1]),
       st.sampled_from(["max", "sum"]))
def test_layout_rules(groups, m_mult, n16, reduce_dim, kind):
    M, N = 64 * groups * m_mult, 16 * n16
    k = lower(build_kernel(fragment_program(M, N, groups, reduce_dim, kind)), HOPPER)
    assert k.find_plan(AsyncPlan) is not None, k.find_plan(AsyncRefusal)
    lp = k.plan(LayoutPlan)
    warps = 4 * groups
    acc = lp.of("acc")
    # the accumulator: M split across the warp groups, one instruction spanning N
    assert acc == layouts.WgmmaAccumulator((warps, 1), (16, N, 16))
    # a reduction's destination is the slice of its source along the reduced dim
    assert lp.of("red") == layouts.RowSlice(reduce_dim, acc)
    # vectors read at [i] / [j] in a 2-d T.Parallel whose frame is acc's layout
    assert lp.of("row") == layouts.RowSlice(1, acc)
    assert lp.of("col") == layouts.RowSlice(0, acc)
    # a fragment -> fragment copy keeps the layout across
    assert lp.of("twin") == acc
    # a fragment nothing constrains (only filled and updated element-wise) is Blocked
    assert lp.of("free") == layouts.Blocked(1, warps)
    frames = dict(lp.frames)
    pars = {next(t.buffer.name for t in walk(p) if isinstance(t, ir.Store)): p.vars[0].name
            for p in walk(k.body) if isinstance(p, ir.Parallel)}
    assert frames[pars["acc"]] == acc            # the frame of a loop storing the accumulator
    assert frames[pars["free"]] == layouts.Blocked(1, warps)
    assert set(frames) == set(pars.values())
