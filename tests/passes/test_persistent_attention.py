"""Attention made persistent (persist over a 3-d grid): each block loops over (query block, head,
batch) tiles, the producer loads each tile's Q into one of two slots once the consumers released
that slot's previous tile (so the next tile's Q and K/V load while this one computes), and the consumer schedule (split roles, the deferred P V with a ring counter for causal rows of
varying length) runs inside the tile loop. The program means the same (interpreter, random
schedules), the wrong protocols are caught, and Triton compiles it for sm_90a."""
from __future__ import annotations

import dataclasses
import functools
import re

import pytest
import torch

from tilews.lowering import ir
from tilews.lowering.errors import DeadlockError, RaceError
from tilews.lowering.frontend import build_kernel
from tilews.lowering.pipeline import lower
from tilews.lowering.plans import PipelinePlan
from tilews.triton_ext.gluon.backend import HOPPER
from tilews.lowering.traverse import transform, walk
from tilews.ops.attention import mha_fwd_program
from examples.attention import reference

from ..helpers import gluon_program, randn, rel_err, roles
from ..test_ws_oracle import run_interp

B, H, D = 1, 2, 64


def program(causal, seq_len=200, block_M=128, threads=256, dim=D):
    return mha_fwd_program(B, H, seq_len, dim, causal, block_M=block_M, block_N=64, num_stages=2,
                           threads=threads)


@functools.lru_cache(maxsize=None)
def lowered(causal, seq_len=200, block_M=128, threads=256, sms=3, slots=2):
    return lower(build_kernel(program(causal, seq_len, block_M, threads)),
                 HOPPER.replace(num_sms=sms, preload_slots=slots))


def inputs(seq_len, seed=0):
    q, k, v = (randn(B, H, seq_len, D, dtype=torch.float16, seed=seed + i) for i in range(3))
    return [q, k, v, torch.empty(B, H, seq_len, D, dtype=torch.float16)]


def tile_loop(role):
    return next(s for s in role.body.stmts if isinstance(s, ir.For) and s.kind is ir.ForKind.PERSISTENT)


# (causal, seq_len, block_M, threads, SMs): 4 tiles over 3 blocks (one runs two); 6 tiles of
# three consumer warp groups over 4 blocks; 4 tiles on one block and 8 over two (each Q slot
# reused: the release is waited for); the last query block ragged in each
CASES = [(False, 200, 128, 256, 3), (True, 200, 128, 256, 3), (True, 400, 192, 384, 4),
         (False, 400, 192, 384, 4), (False, 200, 128, 256, 1), (True, 400, 128, 256, 2)]


@pytest.mark.parametrize("causal,seq_len,block_M,threads,sms", CASES)
def test_persistent_attention_means_the_program(causal, seq_len, block_M, threads, sms):
    args = inputs(seq_len, seed=seq_len + causal)
    before = build_kernel(program(causal, seq_len, block_M, threads))
    want = run_interp(before, args, 3)
    assert rel_err(want, reference(*args[:3], causal)) < 1e-2
    after = lowered(causal, seq_len, block_M, threads, sms)
    assert any(n.startswith("persist: ") and "launch order" in n for n in after.notes), after.notes
    assert any(n.startswith("overlap_softmax:") for n in after.notes), after.notes
    for seed in range(5):
        assert torch.equal(run_interp(after, args, 3, seed), want), seed


def _q_slot(kernel):
    """(Q's buffer, each role's reads of it) in the lowered kernel."""
    q = next(s.buffer for s in walk(kernel.body) if isinstance(s, ir.Alloc) and s.buffer.name == "Q_shared")
    return q, {g: [n for n in walk(r.body) if isinstance(n, ir.Gemm) and n.a.buffer == q]
               for g, r in roles(kernel).items()}


def test_q_is_loaded_per_tile_into_two_slots_after_the_consumers_release_them():
    k = lowered(True)
    rs = roles(k)
    producer = tile_loop(rs[(0,)])
    stmts = producer.body.stmts
    slot = ir.BinOp(ir.BinOpKind.MOD, producer.var, ir.Const(2, ir.DType.I32, producer.loc),
                    ir.DType.I32, producer.loc)
    assert isinstance(stmts[0], ir.BarrierWait) and stmts[0].barrier.buffer.name == "reloadable"
    assert stmts[0].barrier.index == slot
    q = stmts[1]
    assert isinstance(q, ir.Copy) and q.src.buffer.name == "Q" and q.barrier.buffer.name == "preloaded"
    assert q.dst.starts[0] == slot and q.barrier.index == slot
    bars = {s.buffer.name: s.buffer for s in walk(k.body) if isinstance(s, ir.Alloc)}
    assert bars["reloadable"].arrive_counts == (256, 256)     # both consumer warp groups release
    assert bars["preloaded"].arrive_counts == (128, 128)      # the producer's arrival (and bytes)
    qbuf, reads = _q_slot(k)
    assert [ir.as_int(d) for d in qbuf.shape] == [2, 128, D]
    for g in ((1,), (2,)):
        loop = tile_loop(rs[g])
        body = loop.body.stmts
        mine = ir.BinOp(ir.BinOpKind.MOD, loop.var, ir.Const(2, ir.DType.I32, loop.loc), ir.DType.I32, loop.loc)
        assert isinstance(body[0], ir.BarrierWait) and body[0].barrier.buffer.name == "preloaded"
        assert body[0].barrier.index == mine
        # every Q K^T of the role reads the tile's slot
        assert reads[g] and all(n.a.starts[0] == mine for n in reads[g])
        release = next(i for i, s in enumerate(body) if isinstance(s, ir.BarrierArrive)
                       and s.barrier.buffer.name == "reloadable")
        # after the last gemm of the tile (the peeled last P V), before the epilogue
        gemms = [i for i, s in enumerate(body) if any(isinstance(t, ir.Gemm) for t in walk(s))]
        assert max(gemms) < release
        assert any(isinstance(s, ir.Copy) and s.dst.buffer.name == "Output" for s in body[release:])
        # the deferred P V inside the tile loop, its ring slots following the consumer's counter
        inner = next(s for s in body if isinstance(s, ir.For))
        assert any(isinstance(s, ir.GemmWait) and s.outstanding == 1 for s in inner.body.stmts)
        last = inner.body.stmts[-1]
        assert isinstance(last, ir.Store) and last.buffer.scope is ir.Scope.LOCAL


def test_one_slot_where_the_target_asks_or_two_would_not_fit():
    k = lowered(True, slots=1)
    q, _ = _q_slot(k)
    assert [ir.as_int(d) for d in q.shape] == [128, D]
    assert next(s.buffer for s in walk(k.body) if isinstance(s, ir.Alloc)
                and s.buffer.name == "reloadable").arrive_counts == (256,)
    # head dim 256: Q of 64 KB and two K/V slots of 64 KB (O stored from registers): a second Q
    # slot exceeds 227 KB
    big = lower(build_kernel(mha_fwd_program(B, H, 200, 256, True, block_M=128, block_N=64, num_stages=1,
                                             threads=256)), HOPPER.replace(num_sms=1))
    assert [ir.as_int(d) for d in _q_slot(big)[0].shape] == [128, 256]
    assert big.find_plan(PipelinePlan).stages == 2
    assert any(n.startswith("warp_specialize: one slot for the preloads") and "327872 bytes" in n
               for n in big.notes), big.notes


@pytest.mark.parametrize("causal", [False, True])
def test_head_dim_256_stores_its_output_from_each_roles_registers(causal):
    """D256: Q and a two-slot K/V ring take 192 KB, so the output is stored from registers, not
    staged: each split consumer role stores its own 64 rows (split_consumers cuts the global
    tile of a fragment -> global copy too), and the lowered kernel means the program."""
    seq_len, dim = 160, 256
    kernel = lower(build_kernel(mha_fwd_program(1, 1, seq_len, dim, causal, block_M=128, block_N=64,
                                                num_stages=1, threads=256)), HOPPER.replace(num_sms=1))
    assert kernel.find_plan(PipelinePlan).stages == 2
    assert any(n.startswith("warp_specialize: the epilogue stores from registers") for n in kernel.notes)
    stores = [s for s in walk(kernel.body) if isinstance(s, ir.Copy) and s.dst.buffer.name == "Output"]
    assert [s.src.buffer.name for s in stores] == ["acc_o_0", "acc_o_1"]
    assert {s.dst.extents[2] for s in stores} == {64}
    q, k, v = (randn(1, 1, seq_len, dim, dtype=torch.float16, seed=40 + i) for i in range(3))
    out = run_interp(kernel, [q, k, v, torch.empty_like(q)], 3, 1)
    assert rel_err(out, reference(q, k, v, causal)) < 1e-2


@pytest.mark.parametrize("slots", [1, 2])
def test_each_slot_means_the_program_with_a_tile_per_slot_reuse(slots):
    """One block runs all 4 tiles: with two slots each is refilled twice, with one four times."""
    args = inputs(200, seed=11)
    want = run_interp(build_kernel(program(True)), args, 3)
    for seed in range(3):
        assert torch.equal(run_interp(lowered(True, sms=1, slots=slots), args, 3, seed), want), seed


def _caught(wrong, args, want, seeds=range(1), errors=(RaceError,)) -> int:
    """How many of the schedules ``seeds`` catch the ``wrong`` kernel: one of the interpreter's
    ``errors``, or a result other than ``want``."""
    n = 0
    for seed in seeds:
        try:
            n += not torch.equal(run_interp(wrong, args, 3, seed), want)
        except errors:
            n += 1
    return n


def _without(kernel, pred):
    def drop(n):
        if isinstance(n, ir.Seq):
            return dataclasses.replace(n, stmts=tuple(s for s in n.stmts if not pred(s)))
        return None
    return dataclasses.replace(kernel, body=transform(kernel.body, drop))


def test_a_consumer_that_never_releases_q_deadlocks():
    """One block, 4 tiles: the third tile's Q waits for the first's slot to be released."""
    k = _without(lowered(False, sms=1), lambda s: isinstance(s, ir.BarrierArrive)
                 and s.barrier.buffer.name == "reloadable")
    with pytest.raises(DeadlockError, match="reloadable"):
        run_interp(k, inputs(200), 3)


def test_a_producer_refilling_a_slot_without_its_release_is_caught():
    """Causal, 128 x 128 blocks, 3 query blocks per head, one block running all 6 tiles (rows of
    3, 2, 1 key blocks, twice) through a 3-stage K/V ring. Rows shorter than the ring no longer
    hold the producer back: without the reloadable wait it loads the fourth tile's Q into the
    slot whose second tile's Q K^T may still be reading it: a race, or a wrong result. (With
    rows at least as long as the ring, the ring's own waits order the two.)"""
    prog = mha_fwd_program(B, H, 300, D, True, block_M=128, block_N=128, num_stages=3, threads=256)
    right = lower(build_kernel(prog), HOPPER.replace(num_sms=1))
    k = _without(right, lambda s: isinstance(s, ir.BarrierWait) and s.barrier.buffer.name == "reloadable")
    args = inputs(300, seed=3)
    want = run_interp(build_kernel(prog), args, 3)
    for seed in range(8):
        assert torch.equal(run_interp(right, args, 3, seed), want), seed
    assert _caught(k, args, want, seeds=range(8))


def test_consumers_reading_one_slot_while_the_producer_fills_two_is_caught():
    """A consumer whose Q K^T always reads slot 0 computes tile 1 from tile 0's Q (or races)."""
    k = lowered(False, sms=1)
    zero = ir.Const(0, ir.DType.I32, k.loc)

    def slot0(n):
        if isinstance(n, ir.Gemm) and n.a.buffer.name == "Q_shared":
            return dataclasses.replace(n, a=dataclasses.replace(n.a, starts=(zero,) + n.a.starts[1:]))
        return None
    wrong = dataclasses.replace(k, body=transform(k.body, slot0))
    assert wrong != k
    args = inputs(200, seed=4)
    assert _caught(wrong, args, run_interp(build_kernel(program(False)), args, 3))


def test_a_counter_left_behind_by_the_peeled_p_v_is_caught():
    """Causal rows: the peeled last P V must count its block; without that count the next tile's
    slots are one behind: its waits pass on an old phase, and it reads a stage the producer is
    refilling (the interpreter's race check), or never complete, or it reads a stale stage (a
    wrong result)."""
    k = lowered(True)

    def guarded_bump(s):
        return isinstance(s, ir.If) and any(isinstance(t, ir.Store) and t.buffer.scope is ir.Scope.LOCAL
                                            for t in s.then.stmts) and any(isinstance(t, ir.Gemm) for t in walk(s))

    def drop_bump(n):
        if guarded_bump(n):
            return dataclasses.replace(n, then=dataclasses.replace(n.then, stmts=tuple(
                t for t in n.then.stmts if not (isinstance(t, ir.Store) and t.buffer.scope is ir.Scope.LOCAL))))
        return None
    wrong = dataclasses.replace(k, body=transform(k.body, drop_bump))
    assert wrong != k
    args = inputs(200, seed=5)
    assert _caught(wrong, args, run_interp(build_kernel(program(True)), args, 3),
                   errors=(DeadlockError, RaceError))


def test_persistent_attention_compiles_for_sm90a():
    k = lower(build_kernel(mha_fwd_program(2, 4, 1000, D, True, block_M=128, block_N=128, num_stages=2,
                                           threads=256)), HOPPER.replace(num_sms=8))
    assert any(n.startswith("persist: 64 tiles > 8 SMs") for n in k.notes)
    p = gluon_program(k)
    src, ttgir = p.source, p.asm["ttgir"]
    assert "import triton.language" not in src
    producer = ttgir[ttgir.index("partition0("):]
    producer = producer[:producer.index("partition1(")]
    # the producer's tile loop holds Q's load, then the K/V loop's two loads
    loads = [m.start() for m in re.finditer(r"ttng\.async_tma_copy_global_to_local", producer)]
    fors = [m.start() for m in re.finditer(r"scf\.for", producer)]
    assert len(loads) == 3 and len(fors) == 2 and fors[0] < loads[0] < fors[1] < loads[1]
    # preloaded and reloadable per Q slot, full and empty per K and V stage
    assert len(re.findall(r"mbarrier\.init\.shared::cta\.b64", p.asm["ptx"])) == 2 * 2 + 2 * 2 * 2
    assert re.search(r"wgmma\.wait_group\.sync\.aligned\s+1;", p.asm["ptx"])


@pytest.mark.parametrize("total,blocks", [(2048, 132), (4, 3), (6, 4), (264, 132), (133, 132), (1000, 132),
                                          (2, 4), (0, 3)])
@pytest.mark.parametrize("at_launch", [False, True], ids=["static", "at-launch"])
def test_serpentine_rounds_run_every_tile_once(total, blocks, at_launch):
    """persist's 3-d order: each tile in exactly one block, block b at position b of even rounds
    and blocks - 1 - b of odd ones; the count of a block's tiles built from a constant total or
    from a runtime one (a grid sized at launch: fewer tiles than blocks, or none, included)."""
    from tilews.lowering import schedule
    from tilews.lowering.simplify import evaluate
    loc = ir.Loc("t", 1)
    b, it = ir.Var("b", ir.DType.I32, ir.VarKind.BLOCK, loc), ir.Var("it", ir.DType.I32, ir.VarKind.LOOP, loc)
    n_var = ir.Var("n", ir.DType.I32, ir.VarKind.PARAM, loc)
    tile = schedule.serpentine_tile(b, it, blocks, loc)
    count = schedule.serpentine_tiles_of_block(n_var if at_launch else ir.Const(total, ir.DType.I32, loc),
                                               b, blocks, loc)
    seen = []
    for block in range(blocks):
        n = evaluate(count, {b: block, n_var: total})
        tiles = [evaluate(tile, {b: block, it: i}) for i in range(n)]
        assert all(t % blocks == (block if i % 2 == 0 else blocks - 1 - block) for i, t in enumerate(tiles))
        seen += tiles
    assert sorted(seen) == list(range(total))


def test_persistent_block_sparse_attention_means_the_program():
    """A guarded loop (a block mask picks the key blocks) inside the tile loop: each role counts
    the blocks it ran across tiles, and Q is still loaded per tile."""
    from .test_ring_groups import inputs as sparse_inputs, sparse_attention
    before = build_kernel(sparse_attention())
    after = lower(before, HOPPER.replace(num_sms=3))
    assert any(n.startswith("persist: 4 tiles > 3 SMs") for n in after.notes), after.notes
    assert any(isinstance(s, ir.Alloc) and s.buffer.name == "reloadable" for s in walk(after.body))
    for seed in range(2):
        args = list(sparse_inputs(seed))
        want = run_interp(before, args, 4)
        for schedule_seed in range(3):
            assert torch.equal(run_interp(after, args, 4, schedule_seed), want), (seed, schedule_seed)


@pytest.mark.parametrize("causal", [False, True])
def test_tilelangs_own_program_persistent_means_the_program(causal):
    """TileLang's flash-attention example (bhsd: keys longer than queries, a past prefix; its
    causal loop starts where the mask allows) made persistent: 6 tiles over 4 blocks."""
    from ..test_ws_oracle import assert_same_under_schedules
    from ..tilelang_compat.test_flash_attention import flashattn_bhsd_for
    k = flashattn_bhsd_for("interpret")(1, 2, 320, 384, D, causal, block_M=128, block_N=64,
                                        num_stages=2, threads=256)
    q = randn(1, 2, 320, D, dtype=torch.float16, seed=1)
    kv = [randn(1, 2, 384, D, dtype=torch.float16, seed=s) for s in (2, 3)]
    target = HOPPER.replace(num_sms=4)
    assert any(n.startswith("persist: 6 tiles > 4 SMs") for n in lower(k.ir_before, target).notes)
    assert_same_under_schedules(k.ir_before, [q, *kv, torch.empty(1, 2, 320, D, dtype=torch.float16)], 3,
                                seeds=range(4), target=target)
