"""``tilews.ops.matmul`` and its schedules (``tilews.ops.schedule``), on the CPU (the interpreter).

* ``Schedule``: text round trip, rejected texts and knobs; ``bucket``; the heuristic's program per
  shape (table) and its invariants (split_k slices >= 4 k tiles and <= 16, stages fit shared
  memory); ``candidates`` (heuristic first, distinct, 7-16 on the GPU, every program on the CPU).
* Numerics vs float64 torch on the same fp16/bf16 inputs (outputs poisoned with NaN by the
  conftest, so an unwritten element fails), relative Frobenius error:
  float32 out 1e-5 (only float32 rounding of K <= 130 long sums: ~1e-7 measured);
  float16 out 2e-3 (one rounding to 11 bits: ~2e-4 measured); bfloat16 out 1e-2 (8 bits: ~1.7e-3).
  Every program through ``run`` at M in {1, 5, 70}, ragged and non-contiguous shapes, and
  ``matmul``'s own choice.
* One compiled kernel per schedule: a second M of a bucket adds no plan and no kernel; another
  bucket with the same schedule adds a plan pointing at the same kernel.
* The cached call (every CPU schedule, contiguous or not, new data each call) equals the product
  and does each piece of work once: with the argument check, the plan key, the settings and the
  binder's signature look-up and full check all made to raise, it still runs; timed with the
  launch stubbed it costs no more than calling the kernel itself (measured ~3.1 us both: the
  output's ``torch.empty`` is ~1.9 us of it; asserted within 25%); a bound binding still
  re-checks TMA operands' alignment (a binder with the Gluon rule).
* Errors name the argument; empty products (and their zero gradients).
* ``tune``: writes the bucket's winner to the tuning cache under ``TILEWS_CACHE_DIR`` (a tmp
  folder here), a fresh process state reads it back (an edited entry is obeyed), a candidate with
  wrong results is dropped, ``TILEWS_TUNE=1`` tunes at the first call.
* ``torch.compile(fullgraph=True)`` through the ``tilews::matmul`` custom op (inductor on the CPU;
  the graph holds the op) equals eager; ``torch.library.opcheck``, with operands requiring grad
  too (its autograd registration and AOT-dispatch backward checks).
* Autograd: gradients against float64 torch (the exact gradient of the float64 product for a
  random dC) at ragged shapes, per operand dtype and ``out_dtype``, with the tolerances above of
  the operand dtype (dC is rounded to it: float32 dC in bf16 ~2e-3 measured); only the needed
  gradients are computed (ops counted); ``gradcheck`` and ``gradgradcheck`` need double
  operands, which the op refuses, so they run on fp16 operands of small integers with float32
  out and eps = 0.5, where finite differences and products are exact (tolerance 0); routing:
  the op when grad is needed, not without it or under ``no_grad``; ``torch.compile`` of a
  forward and backward.

* float32 operands: ``torch.matmul``'s rule, TF32 where ``allow_tf32`` is set (read per call,
  part of the keys), exact otherwise: on the CPU (the interpreter, exact either way) random
  inputs against float64, relative Frobenius error 1e-5 (~1e-7 measured), every CPU schedule,
  both flag values, each its own plan and kernels, the frontend IR recording ``precision=ieee``
  only for the exact one; ``opcheck`` and the fake implementation take float32.
* ``import tilews`` leaves ``tilews.ops`` unimported until first used (a fresh process).

Runtime: about 15 s on 2 cores.
"""
from __future__ import annotations

import importlib
import json
import logging
import time
import warnings

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import tilews.ops as ops
from tilews.ops.schedule import (FLOAT32, FUSED_MIN_K_TILES, MAX_SPLITS, PROGRAMS, SMEM_BYTES,
                                 REGISTER_STAGED, SPLIT_K_MIN_K_TILES, SPLITTING, STREAM_K,
                                 STREAM_K_MAX_TAIL,
                                 Schedule, bucket, candidates, fit_stages, heuristic)

from .helpers import randn, rel_err, tuned_entries

mm = importlib.import_module("tilews.ops.matmul")     # the module (``ops.matmul`` is the function)

TOL = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1e-2}
CPU_SCHEDULES = ["tiled 64x64x32 s2 t128", "tiled 32x64x32 s2 t128",
                 "persistent 64x64x32 s2 t128 g2", "split_k 64x64x32 s2 t128 x2",
                 "split_k 32x64x32 s1 t128 x3", "split_k_fused 16x64x32 s2 t128 x2",
                 "swap_ab 16x64x32 s2 t128", "stream_k 32x64x32 s2 t128 g2"]


@pytest.fixture
def fresh(monkeypatch, tmp_path):
    """Empty calls, plans, kernels and tuned winners, and a tuning cache in ``tmp_path``."""
    monkeypatch.setattr(mm, "_calls", {})
    monkeypatch.setattr(mm, "_plans", {})
    monkeypatch.setattr(mm, "_kernels", {})
    monkeypatch.setattr(mm, "_scheduled", {})
    monkeypatch.setattr(mm._winners, "tuned", {})
    monkeypatch.setenv("TILEWS_CACHE_DIR", str(tmp_path))
    return tmp_path


def operands(M, N, K, dtype, seed=0):
    return randn(M, K, dtype=dtype, seed=seed), randn(K, N, dtype=dtype, seed=seed + 1)


def assert_product(c, a, b, out_dtype):
    assert c.shape == (a.shape[0], b.shape[1]) and c.dtype == out_dtype
    assert rel_err(c, a.double() @ b.double()) < TOL[out_dtype]


def test_split_k_fused_counters_grow_and_come_back_to_zero(fresh, monkeypatch):
    # the counters are the stream's, grown for a kind with more tiles; a call bound before the
    # growth gets the larger tensor and stays right
    from tilews.ops import arrivals
    monkeypatch.setattr(arrivals, "MIN_COUNTERS", 2)
    monkeypatch.setattr(arrivals, "_counters", {})
    fused = Schedule.from_text("split_k_fused 16x64x32 s2 t128 x2")
    small, large = operands(5, 64, 96, torch.bfloat16, seed=3), operands(40, 192, 96, torch.bfloat16, seed=5)
    for a, b in (small, large, small, large):
        assert_product(ops.run(a, b, None, fused), a, b, torch.bfloat16)
        [counters] = arrivals._counters.values()
        assert int(counters.abs().sum()) == 0
    assert counters.numel() == 9                       # 3 x 3 tiles of the large kind


# --- Schedule, bucket, heuristic, candidates -------------------------------------------------------
@pytest.mark.parametrize("text", CPU_SCHEDULES + ["persistent 128x256x64 s3 t256 g8",
                                                  "split_k 64x128x64 s6 t128 x4 g8",
                                                  "persistent 128x256x64 s3 t256 g8 regs"])
def test_schedule_text_round_trip(text):
    s = Schedule.from_text(text)
    assert str(s) == text and Schedule.from_text(str(s)) == s


@pytest.mark.parametrize("text", ["tiled 64x64 s2 t128", "tiled 64x64x32 t128 s2", "gemm 64x64x32 s2 t128",
                                  "tiled 64x64x32 s2 t128 x2", "persistent 64x64x32 s2 t128", ""])
def test_schedule_rejects(text):
    with pytest.raises(ValueError, match="Schedule"):
        Schedule.from_text(text)


def test_schedule_knob_errors_name_the_knob():
    with pytest.raises(ValueError, match="block_K must be an int >= 1"):
        Schedule("tiled", 64, 64, 0, 2, 128)
    with pytest.raises(ValueError, match="splits=4 is a knob of split_k and split_k_fused, not of swap_ab"):
        Schedule("swap_ab", 16, 64, 32, 2, 128, splits=4)


@pytest.mark.parametrize("M, want", [(0, 0), (1, 1), (2, 2), (3, 4), (5, 8), (64, 64), (65, 128),
                                     (8192, 8192), (100000, 8192)])
def test_bucket(M, want):
    assert bucket(M) == want


@pytest.mark.parametrize("M, N, K, want", [     # the picks measured best on an H100/H200 (schedule.py)
    (1, 4096, 4096, "split_k_fused 16x64x128 s4 t128 x2"),   # 64 tiles: K split 2 ways, summed
    (32, 4096, 14336, "split_k_fused 32x64x128 s4 t128 x2"),  # in the same kernel
    (16, 14336, 4096, "split_k_fused 16x128x128 s4 t128 x2"),  # N has half the SMs' tiles: (H200)
    (1, 14336, 14336, "split_k_fused 16x128x128 s4 t128 x2"),  # wider blocks, K split
    (32, 14336, 4096, "tiled 64x256x64 s4 t128 g8"),      # N alone has enough tiles
    (128, 4096, 4096, "tiled 64x64x64 s12 t128 g8"),       # the largest tile filling the SMs
    (128, 14336, 4096, "tiled 128x128x64 s6 t128 g8"),
    (777, 512, 4096, "tiled 64x64x64 s12 t128 g8"),
    (1000, 1100, 1234, "split_k 64x128x64 s8 t128 x3"),   # 144 tiles would leave a wave idle
    (513, 257, 129, "tiled 64x64x64 s12 t128 g8"),         # few tiles, but K too short to split
    (4095, 4097, 4099, "split_k 64x128x64 s6 t128 x2"),   # unaligned rows: no 128-row tile
    (4095, 4097, 255, "swap_ab 64x128x64 s6 t128"),       # ... and K too short to split
    (4096, 4096, 4096, "persistent 128x256x64 s3 t256 g8"),
])
def test_heuristic_table(M, N, K, want):
    assert str(heuristic(M, N, K, torch.bfloat16, torch.bfloat16, 132, True)) == want


def test_heuristic_on_cpu_and_with_float32_out():
    assert str(heuristic(4096, 4096, 4096, torch.float16, torch.float16, 132, False)) == \
        "tiled 64x64x32 s2 t128"
    # the 128x256 float32 output tile takes shared memory from the ring
    assert heuristic(4096, 4096, 4096, torch.bfloat16, torch.float32, 132, True).num_stages == 2


@pytest.mark.parametrize("precision, want", [("ieee", "tiled 64x128x32 s4 t128"),
                                              ("tf32", "tiled 128x128x32 s4 t256")])
def test_float32_operands_get_their_own_tiles(precision, want):
    """float32 runs on the tl path on Hopper: k-blocks of 32 (stages fit), per precision, above
    the narrow rows (which keep their 16-bit picks); the tuning space holds both."""
    narrow = heuristic(16, 4096, 4096, torch.float32, torch.float32, 132, True, precision)
    assert narrow.program == "split_k_fused" and narrow.block_M == 16
    for M, N, K in ((4096, 4096, 4096), (1000, 1100, 1234), (128, 4096, 4096)):
        pick = heuristic(M, N, K, torch.float32, torch.float32, 132, True, precision)
        assert str(pick) == want
        space = candidates(M, N, K, torch.float32, torch.float32, 132, True, precision)
        assert space[0] == pick and {str(s) for s in FLOAT32.values()} <= {str(s) for s in space}


SHAPES = [(M, N, K) for M in (1, 16, 32, 64, 128, 512, 2048, 8192)
          for N, K in ((4096, 4096), (14336, 4096), (4096, 14336), (257, 129), (512, 4096))]


@pytest.mark.parametrize("out", [torch.bfloat16, torch.float32])
def test_heuristic_and_candidates_invariants(out):
    for M, N, K in SHAPES:
        space = candidates(M, N, K, torch.bfloat16, out, 132, True)
        assert space[0] == heuristic(M, N, K, torch.bfloat16, out, 132, True)
        assert len(set(space)) == len(space) and 7 <= len(space) <= 20, (M, N, K, space)
        for s in space:
            ring = s.num_stages * (s.block_M + s.block_N) * s.block_K * 2
            tile = s.block_M * s.block_N * (4 if s.program in SPLITTING else out.itemsize)
            assert ring + tile <= SMEM_BYTES, s
            if s.program in SPLITTING:
                least = SPLIT_K_MIN_K_TILES if s.program == "split_k" else FUSED_MIN_K_TILES
                assert 2 <= s.splits <= min(MAX_SPLITS, K // (least * s.block_K)), s
            if s.program == "swap_ab":          # the small-M space, or the unaligned pick
                assert M <= 64 or s == space[0], (M, N, K, s)
        # stream_k only where 128x256 tiles leave a last wave at most STREAM_K_MAX_TAIL full
        tiles = -(-M // 128) * -(-N // 256)
        tail = tiles % 132
        tried = [s for s in space if s.program == "stream_k"]
        assert bool(tried) == (tiles >= 132 and 0 < tail <= STREAM_K_MAX_TAIL * 132), (M, N, K)
        assert all(s == fit_stages(STREAM_K, torch.bfloat16, out) for s in tried)
        # the register-staged producer only where TMA cannot take the rows (N = 257, K = 129)
        staged = [s for s in space if s.registers]
        assert bool(staged) == (N % 8 != 0), (M, N, K)
        assert all(s in [fit_stages(r, torch.bfloat16, out) for r in REGISTER_STAGED] for s in staged)
    for shape, full in (((8192, 8192, 8192), True), ((4096, 4096, 4096), False)):   # 52%, 88%
        space = candidates(*shape, torch.bfloat16, out, 132, True)
        assert any(s.program == "stream_k" for s in space) == full


def test_cpu_candidates_cover_every_program():
    space = candidates(8, 80, 96, torch.float16, torch.float16, 132, False)
    assert {s.program for s in space} == set(PROGRAMS)


# --- numerics -----------------------------------------------------------------------------------
@pytest.mark.parametrize("text", CPU_SCHEDULES)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_run_every_schedule(fresh, text, dtype):
    s = Schedule.from_text(text)
    for M in (1, 5, 70):
        a, b = operands(M, 80, 96, dtype, seed=M)
        assert_product(ops.run(a, b, torch.float32, s), a, b, torch.float32)
    assert len(mm._kernels) == 1        # one kernel (or split_k's pair) served the three Ms


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("out", [None, torch.float16, torch.bfloat16, torch.float32])
def test_matmul_out_dtypes(fresh, dtype, out):
    a, b = operands(70, 80, 96, dtype)
    assert_product(ops.matmul(a, b, out), a, b, out or dtype)


@pytest.mark.parametrize("M, N, K", [(5, 1, 1), (33, 130, 50), (1, 200, 161), (129, 3, 70)])
def test_matmul_ragged_shapes(fresh, M, N, K):
    a, b = operands(M, N, K, torch.bfloat16, seed=N)
    assert_product(ops.matmul(a, b, torch.float32), a, b, torch.float32)


def test_matmul_non_contiguous_inputs(fresh):
    for seed in (0, 10):                              # the second round: the cached calls
        a, b = operands(70, 80, 96, torch.float16, seed=seed)
        at, bt = a.t().contiguous().t(), b.t().contiguous().t()          # column-major views
        assert not at.is_contiguous() and not bt.is_contiguous()
        assert_product(ops.matmul(at, bt), a, b, torch.float16)
        assert_product(ops.matmul(a[:, ::2], b[::2]), a[:, ::2], b[::2], torch.float16)
    assert len(mm._calls) == 2


def test_one_kernel_serves_every_M(fresh):
    b = randn(96, 80, dtype=torch.bfloat16, seed=1)
    for M in (70, 100):                                   # one bucket (128)
        a = randn(M, 96, dtype=torch.bfloat16, seed=M)
        assert_product(ops.matmul(a, b), a, b, torch.bfloat16)
        assert (len(mm._plans), len(mm._kernels)) == (1, 1)
    a = randn(5, 96, dtype=torch.bfloat16, seed=5)          # bucket 8: the same CPU schedule
    assert_product(ops.matmul(a, b), a, b, torch.bfloat16)
    assert (len(mm._plans), len(mm._kernels)) == (2, 1)
    first, second = mm._plans.values()
    assert first is second is next(iter(mm._kernels.values()))


# --- errors and empty products -----------------------------------------------------------------
A, B = randn(4, 8, dtype=torch.float16), randn(8, 3, dtype=torch.float16)


@pytest.mark.parametrize("args, exc, match", [
    ((A[0], B), ValueError, r"'a' must be a 2-d tensor, got 1-d \[8\]"),
    ((A, B[None]), ValueError, r"'b' must be a 2-d tensor, got 3-d"),
    ((A.double(), B), TypeError, r"'a' is torch.float64"),
    ((A.float(), B), TypeError, r"'b' is torch.float16; .* \(a is torch.float32\)"),
    ((A, B.bfloat16()), TypeError, r"'b' is torch.bfloat16; .* \(a is torch.float16\)"),
    ((A, B[:5]), ValueError, r"a is \[4, 8\] but b is \[5, 3\]"),
    ((A, B, torch.int32), TypeError, r"out_dtype must be .* got torch.int32"),
    ((A.tolist(), B), TypeError, r"'a' must be a torch.Tensor, got list"),
    ((A, B.to("meta")), ValueError, r"'b' is on meta but 'a' is on cpu"),
])
def test_errors_name_the_argument(args, exc, match):
    for _ in range(2):                  # a failed call leaves nothing cached that lets it through
        with pytest.raises(exc, match=match):
            ops.matmul(*args)
    with pytest.raises(exc, match=match):
        ops.run(*args[:2], args[2] if len(args) > 2 else None, Schedule.from_text(CPU_SCHEDULES[0]))


@pytest.mark.parametrize("M, N, K", [(0, 3, 8), (4, 0, 8), (0, 0, 0), (4, 3, 0)])
def test_empty_products(fresh, M, N, K):
    a, b = randn(M, K, dtype=torch.bfloat16), randn(K, N, dtype=torch.bfloat16)
    for c in (ops.matmul(a, b, torch.float32), ops.run(a, b, torch.float32, Schedule.from_text(CPU_SCHEDULES[0]))):
        assert c.shape == (M, N) and c.dtype == torch.float32 and bool((c == 0).all())
    assert mm._kernels == {}
    a.requires_grad_(), b.requires_grad_()
    ops.matmul(a, b).backward(randn(M, N, dtype=torch.bfloat16))
    assert bool((a.grad == 0).all()) and bool((b.grad == 0).all())
    assert a.grad.shape == (M, K) and b.grad.shape == (K, N)


# --- tuning -------------------------------------------------------------------------------------
def test_tune_writes_the_winner_and_matmul_reads_it(fresh, monkeypatch, caplog):
    a, b = operands(5, 80, 96, torch.float16)
    with caplog.at_level(logging.INFO, logger="tilews.ops"):
        winner = ops.tune(a, b, warmup=1, rep=2)
    space = candidates(bucket(5), 80, 96, torch.float16, torch.float16, 132, False)
    assert winner in space
    timed = [r.getMessage() for r in caplog.records if " ms" in r.getMessage()]
    assert len(timed) == len(space), [r.getMessage() for r in caplog.records]   # none dropped
    [entry] = tuned_entries(fresh, "matmul")
    assert entry["winner"] == str(winner) and entry["key"][-3:] == [80, 96, 8]
    # A new process (nothing in memory) follows the disk, even an entry edited by hand.
    chosen = Schedule.from_text("swap_ab 16x64x32 s2 t128")
    [path] = (fresh / "ops" / "matmul").glob("*.json")
    path.write_text(json.dumps({**entry, "winner": str(chosen)}))
    monkeypatch.setattr(mm._winners, "tuned", {})
    monkeypatch.setattr(mm, "_calls", {})
    monkeypatch.setattr(mm, "_plans", {})
    monkeypatch.setattr(mm, "_kernels", {})
    a2 = randn(7, 96, dtype=torch.float16, seed=7)      # another M of the bucket
    assert ops.matmul_schedule(a2, b) == chosen
    assert_product(ops.matmul(a2, b), a2, b, torch.float16)
    assert [k[0] for k in mm._kernels] == [chosen]
    # another bucket is not affected
    assert ops.matmul_schedule(randn(70, 96, dtype=torch.float16), b) == heuristic(
        128, 80, 96, torch.float16, torch.float16, 132, False)


def test_tune_drops_wrong_candidates(fresh, monkeypatch):
    good, bad = Schedule.from_text(CPU_SCHEDULES[1]), Schedule.from_text(CPU_SCHEDULES[0])
    build = mm._build

    def wrong_for_bad(s, *args):
        run = build(s, *args)
        return (lambda a, b: run(a, b) * 1.05) if s == bad else run
    monkeypatch.setattr(mm, "_build", wrong_for_bad)
    monkeypatch.setattr(mm, "candidates", lambda *args: [bad, good])
    a, b = operands(70, 80, 96, torch.bfloat16)
    assert ops.tune(a, b, torch.float32, warmup=1, rep=2) == good
    monkeypatch.setattr(mm, "candidates", lambda *args: [bad])
    with pytest.raises(RuntimeError, match=r"(?s)no candidate.*tiled 64x64x32 s2 t128: AssertionError"):
        ops.tune(a, b, torch.float32, warmup=1, rep=2)


def test_env_switch_tunes_at_the_first_call(fresh, monkeypatch):
    monkeypatch.setenv("TILEWS_TUNE", "1")
    a, b = operands(20, 80, 96, torch.bfloat16)
    assert tuned_entries(fresh, "matmul") == []
    assert_product(ops.matmul(a, b), a, b, torch.bfloat16)
    [entry] = tuned_entries(fresh, "matmul")
    assert entry["key"][-1] == 32 and ops.matmul_schedule(a, b) == Schedule.from_text(entry["winner"])
    assert_product(ops.matmul(a, b), a, b, torch.bfloat16)   # planned now: no second tuning
    assert len(tuned_entries(fresh, "matmul")) == 1


def test_tune_rejects_empty_products():
    with pytest.raises(ValueError, match=r"tune\(\): nothing to tune .* 0, 3, 8"):
        ops.tune(randn(0, 8, dtype=torch.float16), randn(8, 3, dtype=torch.float16))


# --- torch.compile and the custom op -------------------------------------------------------------
def test_torch_compile_traces_through_the_custom_op(fresh):
    def f(a, b):
        return torch.relu(ops.matmul(a, b))
    graphs = []

    def record(gm, example_inputs):
        graphs.append(str(gm.graph))
        return gm
    a, b = operands(70, 80, 96, torch.bfloat16)
    assert torch.equal(torch.compile(f, fullgraph=True, backend=record)(a, b), f(a, b))
    assert "tilews.matmul" in graphs[0]
    compiled = torch.compile(f, fullgraph=True)
    for M in (70, 5):
        a = randn(M, 96, dtype=torch.bfloat16, seed=M)
        assert torch.equal(compiled(a, b), f(a, b))


@pytest.mark.parametrize("out", [None, torch.float32])
@pytest.mark.parametrize("grad", ["", "a", "ab"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_opcheck(fresh, out, grad, dtype):
    a, b = operands(5, 80, 96, dtype)
    a.requires_grad_("a" in grad), b.requires_grad_("b" in grad)
    result = torch.library.opcheck(torch.ops.tilews.matmul.default, (a, b, out))
    assert set(result.values()) == {"SUCCESS"}


# --- the hot path -------------------------------------------------------------------------------
@pytest.mark.parametrize("text", CPU_SCHEDULES)
def test_cached_calls_of_every_schedule(fresh, monkeypatch, text):
    """First and cached calls of one kind (new data each time), contiguous or not, and a second M
    of the bucket, for each program (split_k binds its reduction to the workspace's signature)."""
    schedule = Schedule.from_text(text)
    monkeypatch.setattr(mm, "_choice", lambda *args: schedule)
    for seed in (0, 1, 2):
        for M in (5, 7):
            a, b = operands(M, 80, 96, torch.bfloat16, seed=seed * 10 + M)
            assert_product(ops.matmul(a, b, torch.float32), a, b, torch.float32)
            at = a.t().contiguous().t()
            assert_product(ops.matmul(at, b, torch.float32), a, b, torch.float32)
    assert len(mm._calls) == 4 and len(mm._plans) == 1 and [k[0] for k in mm._kernels] == [schedule]


def test_cached_call_does_each_piece_of_work_once(fresh, monkeypatch):
    a, b = operands(70, 80, 96, torch.float16)
    ops.matmul(a, b)
    [runner] = mm._plans.values()
    [kernel] = runner.kernels

    def again(*args, **kwargs):
        raise AssertionError("a cached call did this again")
    for owner, name in [(mm, "check"), (mm, "_plan_key"), (mm.Settings, "from_env"),
                        (kernel.binder, "_fast"), (kernel.binder, "_signature"),
                        (kernel.binder, "_check")]:
        monkeypatch.setattr(owner, name, again)
    for seed in (1, 2):
        a, b = operands(70, 80, 96, torch.float16, seed=seed)
        assert_product(ops.matmul(a, b), a, b, torch.float16)


def test_cached_call_costs_no_more_than_the_kernel(fresh, monkeypatch):
    """The launch stubbed (a no-op), a cached ``matmul`` call against calling its kernel: the key,
    one lookup, the bound binding, the output's allocation. ~3.1 us both on this CPU."""
    a, b = operands(64, 64, 64, torch.bfloat16)
    ops.matmul(a, b)
    [runner] = mm._plans.values()
    [kernel] = runner.kernels
    monkeypatch.setattr(kernel.program, "launch", lambda values: None)
    mm._calls.clear()                                  # the cached call takes the stub in
    ops.matmul(a, b)
    n, best = 2000, {}
    for _ in range(7):                                 # interleaved, best of 7
        for name, fn in (("kernel", kernel), ("matmul", ops.matmul)):
            start = time.perf_counter()
            for _ in range(n):
                fn(a, b)
            best[name] = min(best.get(name, float("inf")), (time.perf_counter() - start) / n * 1e6)
    assert best["matmul"] < 10, best
    assert best["matmul"] < 1.25 * best["kernel"], best


# --- autograd --------------------------------------------------------------------------------------
class OpCalls(TorchDispatchMode):
    """Counts calls of the ``tilews::matmul`` op."""

    def __init__(self):
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.count += func is torch.ops.tilews.matmul.default
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("dtype, out", [(torch.float16, None), (torch.bfloat16, None),
                                        (torch.bfloat16, torch.float32), (torch.float16, torch.float32),
                                        (torch.float16, torch.bfloat16)])
@pytest.mark.parametrize("M, N, K", [(33, 70, 50), (1, 130, 161), (129, 3, 70)])
def test_gradients_match_float64(fresh, dtype, out, M, N, K):
    a, b = operands(M, N, K, dtype, seed=M + N)
    a.requires_grad_(), b.requires_grad_()
    c = ops.matmul(a, b, out)
    assert_product(c.detach(), a.detach(), b.detach(), out or dtype)
    dc = randn(M, N, dtype=c.dtype, seed=K)
    with OpCalls() as calls:
        c.backward(dc)
    assert calls.count == 2
    exact = dc.double()
    for grad, want in ((a.grad, exact @ b.detach().double().T), (b.grad, a.detach().double().T @ exact)):
        assert grad.dtype == dtype and grad.shape == want.shape
        assert rel_err(grad, want) < TOL[dtype]


@pytest.mark.parametrize("which", ["a", "b"])
def test_backward_computes_only_the_needed_gradient(fresh, which):
    a, b = operands(20, 30, 40, torch.bfloat16)
    (a if which == "a" else b).requires_grad_()
    c = ops.matmul(a, b)
    dc = randn(20, 30, dtype=torch.bfloat16, seed=3)
    with OpCalls() as calls:
        c.backward(dc)
    assert calls.count == 1
    grad, other = (a.grad, b.grad) if which == "a" else (b.grad, a.grad)
    want = dc.double() @ b.double().T if which == "a" else a.double().T @ dc.double()
    assert other is None and rel_err(grad, want) < TOL[torch.bfloat16]


def test_autograd_routing(fresh):
    """The op (with its backward) only when a gradient is needed."""
    a, b = operands(20, 30, 40, torch.float16)
    for _ in range(2):                                 # first and cached calls
        with OpCalls() as calls:
            plain = ops.matmul(a, b)
        assert calls.count == 0 and plain.grad_fn is None
        b.requires_grad_()
        with OpCalls() as calls:
            c = ops.matmul(a, b)
        assert calls.count == 1 and c.requires_grad and "tilews_matmul" in type(c.grad_fn).__name__
        with torch.no_grad(), OpCalls() as calls:
            c = ops.matmul(a, b)
        assert calls.count == 0 and not c.requires_grad
        assert_product(c, a, b.detach(), torch.float16)
        b.requires_grad_(False)


def test_gradcheck_on_exact_half_inputs():
    """``gradcheck`` wants double operands, which the op refuses: fp16 operands of small integers
    with a float32 result make every product, sum and central difference (eps 0.5) exact, so
    the analytical and numerical Jacobians must agree exactly (and the second derivatives, for
    an integer dC)."""
    g = torch.Generator().manual_seed(0)
    a, b = (torch.randint(-3, 4, shape, generator=g).half().requires_grad_() for shape in ((3, 5), (5, 4)))
    dc = torch.randint(-3, 4, (3, 4), generator=g).float()

    def f(a, b):
        return ops.matmul(a, b, torch.float32)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "Input #[01] requires gradient and is not a double")
        assert torch.autograd.gradcheck(f, (a, b), eps=0.5, atol=0, rtol=0)
        assert torch.autograd.gradgradcheck(f, (a, b), (dc,), eps=0.5, atol=0, rtol=0)


def test_torch_compile_forward_and_backward(fresh):
    def f(a, b):
        return torch.relu(ops.matmul(a, b, torch.float32)).sum()
    compiled = torch.compile(f, fullgraph=True)
    for M in (33, 5):
        a, b = operands(M, 70, 50, torch.bfloat16, seed=M)
        eager_a, eager_b = a.clone().requires_grad_(), b.clone().requires_grad_()
        a.requires_grad_(), b.requires_grad_()
        loss = compiled(a, b)
        loss.backward()
        f(eager_a, eager_b).backward()
        # inductor sums in its own order: float32 rounding apart
        torch.testing.assert_close(loss, f(a.detach(), b.detach()), rtol=1e-6, atol=0)
        assert torch.equal(a.grad, eager_a.grad) and torch.equal(b.grad, eager_b.grad)
        mask = (a.detach().double() @ b.detach().double() > 0).double()
        assert rel_err(a.grad, mask @ b.detach().double().T) < TOL[torch.bfloat16]
        assert rel_err(b.grad, a.detach().double().T @ mask) < TOL[torch.bfloat16]


def test_a_bound_binding_still_checks_alignment(fresh):
    """On a GPU the cached call's binding (``Binder.bound``) re-checks the TMA operands' alignment,
    as every kernel call does: a binder with the Gluon program's bulk-copy rule, on the CPU."""
    from tilews.binding import Binder
    from tilews.lowering.arguments import ArgumentRules
    a, b = operands(70, 80, 96, torch.float16)
    ops.matmul(a, b)
    [runner] = mm._plans.values()
    [kernel] = runner.kernels
    binder = Binder(kernel.binder.function, [p.name for p in kernel.binder.params], [-1],
                    ArgumentRules(bulk_copy=frozenset({"A", "B"})))
    bind = binder.bound((a, b))
    values, [c] = bind(a, b)
    tensors = [v for v in values if isinstance(v, torch.Tensor)]
    assert c.shape == (70, 80) and len(tensors) == 3 and all(t is u for t, u in zip(tensors, (a, b, c)))
    shifted = randn(70 * 96 + 1, dtype=torch.float16)[1:].view(70, 96)   # same signature, 2-byte offset
    with pytest.raises(ValueError, match="parameter 'A' must have a 16-byte aligned address"):
        bind(shifted, b)


# --- float32 operands ------------------------------------------------------------------------------
@pytest.fixture
def set_tf32():
    """Sets ``torch.backends.cuda.matmul.allow_tf32`` and restores it afterwards. Assigned, not
    monkeypatched: the flag is a computed attribute of torch's cuBLAS module object, and in CI's
    fresh environment pytest's undo found nothing to put back and tried to delete it."""
    matmul = torch.backends.cuda.matmul
    before = matmul.allow_tf32

    def set_flag(value: bool) -> None:
        matmul.allow_tf32 = value
    yield set_flag
    matmul.allow_tf32 = before


@pytest.fixture(params=[False, True], ids=["ieee", "tf32"])
def allow_tf32(request, set_tf32):
    set_tf32(request.param)
    return request.param


@pytest.mark.parametrize("M, N, K", [(70, 80, 96), (5, 33, 130), (1, 64, 7)])
def test_float32_operands(fresh, allow_tf32, M, N, K):
    a, b = operands(M, N, K, torch.float32, seed=M)
    assert_product(ops.matmul(a, b), a, b, torch.float32)
    assert_product(ops.matmul(a, b, torch.bfloat16), a, b, torch.bfloat16)
    precision = "tf32" if allow_tf32 else "ieee"
    assert {k[-1] for k in mm._kernels} == {precision}
    gemms = [k.ir_text("before") for r in mm._kernels.values() for k in r.kernels]
    gemms = [text for text in gemms if "gemm " in text]
    assert gemms and all(("precision=ieee" in text) == (not allow_tf32) for text in gemms)


@pytest.mark.parametrize("text", CPU_SCHEDULES)
def test_float32_every_schedule(fresh, text):
    a, b = operands(37, 70, 96, torch.float32, seed=3)
    assert_product(ops.run(a, b, None, Schedule.from_text(text)), a, b, torch.float32)


def test_allow_tf32_is_read_at_each_call(fresh, set_tf32):
    a, b = operands(70, 80, 96, torch.float32)
    for flag in (False, True, False):
        set_tf32(flag)
        assert_product(ops.matmul(a, b), a, b, torch.float32)
    assert len(mm._calls) == 2 and sorted(k[-1] for k in mm._plans) == ["ieee", "tf32"]
    # 16-bit operands: the flag changes nothing
    h = [t.half() for t in (a, b)]
    ops.matmul(*h)
    set_tf32(True)
    ops.matmul(*h)
    assert len(mm._calls) == 3


def test_import_tilews_leaves_ops_for_first_use():
    import subprocess
    import sys
    code = ("import sys, tilews\n"
            "assert 'tilews.ops' not in sys.modules\n"
            "assert 'ops' in dir(tilews) and not hasattr(tilews, 'no_such_name')\n"
            "assert 'tilews.ops' not in sys.modules\n"
            "matmul = tilews.ops.matmul\n"
            "import tilews.ops\n"
            "assert 'tilews.ops' in sys.modules and matmul is tilews.ops.matmul\n")
    subprocess.run([sys.executable, "-c", code], check=True)
