"""The attention backward's split tail (``tilews/ops/attention_backward.py``: ``bwd_program``'s
``tail_units`` / ``tail_parts``, ``tail_split``): the last units of the main kernel's grid each
run as several blocks over shares of their query blocks, adding dK and dV into a float32
workspace that a second kernel casts. Forced on the CPU targets (the op splits on a GPU
only, at D64 and D128): the gradients against float64 (MHA and GQA, parts adding by
tile and by element, a ragged sequence); the op's decision for a few (units, SMs) pairs; the
program's refusals. Compile-only
(Hopper, the op's blocks at B4 H32 S4096 D128 and B8 H16 S4096 D64, 4 units x 33 parts): the
kernel stays warp-specialized and persistent, D64 keeps one role per consumer warp group (each
adds its own rows of dK / dV by bulk reduce-add) without spills, D128 adds by element and spills
only outside its query-block loop; the D64 kernel lowered for Hopper gives the float64 gradients
on the interpreter. The D192 split (B2 H4 S1000) compiled for Hopper fits Triton's scratch beside
its plan: lowered again with one preload slot."""
from __future__ import annotations

import re

import pytest
import torch

import tilews.language as T
from tilews.ops.attention_backward import blocks, bwd_program, kernels, op_tail_split, tail_split

from .helpers import randn
from .test_attention_backward import _reference, _rel


def _inputs(B, H, KV, S, D, causal=False):
    q, do = (randn(B, H, S, D, dtype=torch.float16, seed=s) for s in (1, 4))
    k, v = (randn(B, KV, S, D, dtype=torch.float16, seed=s) for s in (2, 3))
    o, lse = torch.ops.tilews.attention(q, k, v, causal, "bhsd")
    return q, k, v, do, o, lse


@pytest.mark.parametrize("target, group, parts, tile_add", [("interpret", 1, 2, True),
                                                            ("interpret", 2, 4, False),
                                                            ("triton", 2, 3, True)])
def test_split_tail_gives_the_float64_gradients(target, group, parts, tile_add):
    """8 units (2 KV heads x 4 key blocks of 64, the last ragged: S = 200), the last 3 each in
    ``parts`` blocks (GQA: a part's share may cross from one query head to the next); dq, dk,
    dv poisoned, dQ's accumulator too before the preprocess zeroes it; the workspace zeroed, as
    the op does, and holding the parts' sums afterwards."""
    B, H, S, D = 1, 2 * group, 200, 64
    q, k, v, do, o, lse = _inputs(B, H, 2, S, D)
    rows = lse.shape[-1]
    pre, main, post = kernels(target)
    delta, dq_acc = torch.empty_like(lse), torch.full((B, H, rows, D), float("nan"))
    pre(B, H, S, D, rows, dtype=T.float16)(o, do, delta, dq_acc)
    dq, dk, dv = (torch.full_like(t, float("nan")) for t in (q, k, v))
    cfg = dict(blocks(D, False), tail_units=3, tail_parts=parts, tail_tile_add=tile_add)
    dkv = torch.zeros(3, 2, cfg["block_M"], D)
    main(B, H, 2, S, D, False, rows, dtype=T.float16, **cfg)(q, k, v, do, lse, delta, dq_acc, dk, dv, dkv)
    post(B, H, S, D, rows, dtype=T.float16)(dq_acc, dq)
    want = _reference(q, k, v, do, False, "bhsd")
    for name, got, w in zip("qkv", (dq, dk, dv), want):
        assert _rel(got, w) < 2e-3, name
    # the tail (units 5, 6, 7: key blocks 1-3 of KV head 1) went through the workspace
    for slot, bx in enumerate((1, 2, 3)):
        n = min(64, S - 64 * bx)
        assert torch.equal(dkv[slot, 0, :n].half(), dk[0, 1, 64 * bx:64 * bx + n])
        assert torch.equal(dkv[slot, 1, :n].half(), dv[0, 1, 64 * bx:64 * bx + n])


@pytest.mark.parametrize("units, sms, trips, want", [
    (4096, 132, 64, (4, 33)),       # B4 H32 S4096 D128: 31 full waves and 4 units
    (4224, 132, 64, (0, 1)),        # whole waves
    (4096 + 62, 132, 64, (66, 2)),  # half a wave
    (4096 + 63, 132, 64, (0, 1)),   # more than half
    (133, 132, 8, (1, 8)),          # as many parts as query blocks
    (10, 132, 64, (10, 13)),        # one wave, 10 units: 130 blocks
    (133, 132, 1, (0, 1)),          # one query block: nothing to split
])
def test_tail_split_decision(units, sms, trips, want):
    assert tail_split(units, sms, trips) == want


@pytest.mark.parametrize("dim, causal, want", [(128, False, (4, 33)), (64, False, (4, 33)),
                                               (128, True, (0, 1)),     # causal: no split
                                               (96, False, (0, 1)),     # measured slower
                                               (192, False, (0, 1))])   # measured slower
def test_the_op_splits_non_causal_programs_at_d64_and_d128(dim, causal, want):
    B, H, S = (4, 32, 4096) if dim == 128 else (8, 16, 4096)
    assert op_tail_split(B, H, H, S, dim, causal, blocks(dim, True), 132) == want


@pytest.mark.parametrize("change, match", [(dict(is_causal=True), "is_causal=True"),
                                           (dict(tail_units=9), "tail_units=9"),
                                           (dict(tail_parts=1), "tail_parts=1"),
                                           (dict(tail_parts=8), "2 <= tail_parts <= 7")])
def test_split_tail_refusals_name_the_parameters(change, match):
    args = dict(batch=1, heads=2, kv_heads=2, seq_len=200, dim=64, is_causal=False, rows=200,
                tail_units=3, tail_parts=2, **blocks(64, False))
    with pytest.raises(ValueError, match=match):
        bwd_program(**dict(args, **change))


def _hopper(D, **change):
    """The op's main kernel (the first of the split program's two) lowered for an H100."""
    from tilews.lowering.frontend import build_function
    from tilews.lowering.pipeline import lower
    from tilews.triton_ext.gluon.backend import HOPPER
    B, H = (4, 32) if D == 128 else (8, 16)
    program = bwd_program(B, H, H, 4096, D, False, 4096, dtype=T.float16,
                          **dict(blocks(D, True), **change))
    function = build_function(program)
    return lower(function.kernels[0], HOPPER.replace(num_sms=132)), len(function.kernels)


@pytest.mark.parametrize("D", [64, 128])
def test_split_tail_compiles_warp_specialized_on_hopper(D):
    """Compile-only (sm_90a), 4 units x 33 parts: 4224 tiles, one persistent block per SM, the
    parts in its last round. D64: one role per consumer warp group, each adding its 64 rows of
    the part's dK and dV by bulk reduce-add (its own staging tile), no spills. D128 (one role
    of two warp groups): by element (a 64 KB staging tile would leave the whole units' stores no
    shared memory); its spills (the split's run-time shares and slot, 48 bytes against the
    unsplit kernel's 8) stay outside the query-block loop."""
    from tilews.lowering.plans import ConsumerSplit
    from tilews.triton_ext.gluon import emit
    from tilews.triton_ext.toolchain import ptxas_report, sass

    from .helpers import gluon_program, innermost_loops

    lowered, kernel_count = _hopper(D, tail_units=4, tail_parts=33)
    assert kernel_count == 2                      # the main kernel, then the cast
    assert any(n.startswith("persist: 4224 tiles > 132 SMs") for n in lowered.notes), lowered.notes
    source = emit(lowered)
    assert "gl.warp_specialize(" in source and "warpgroup_mma(" in source
    assert "dv_stage" in source                   # whole units: staged stores (TMA)
    if D == 64:
        assert lowered.find_plan(ConsumerSplit) is not None, lowered.notes
        assert len(re.findall(r"async_reduce_add\(dKV_desc_0, .*, part_s_[01]\)", source)) == 4
    else:
        assert re.search(r"gl\.atomic_add\(dKV \+", source) and "part_s" not in source
    program = gluon_program(lowered)
    report = ptxas_report(program.asm["ptx"])
    if report is None:
        pytest.skip("this Triton bundles no ptxas")
    spilled = int(re.search(r"(\d+) bytes spill stores", report).group(1))
    assert spilled == 0 if D == 64 else spilled <= 64, report
    loop = max(innermost_loops(sass(program.asm["ptx"])), key=len)
    assert not [op for op in loop if op.startswith(("STL", "LDL"))]


def test_split_tail_at_head_dim_192_is_lowered_again_for_tritons_scratch():
    """Compile-only (sm_90a) through the compile path, the GPU test's D192 split (B2 H4 S1000,
    64 units x 2 parts): its plan (two preload slots, 230496 bytes) fits 232448, but Triton's
    own scratch beside it (a ``convert_layout`` between dot operands of two mma parents: about
    4 KB) took the kernel past an H200's shared memory at launch. The compiler lowers it again
    for 232448 less that scratch: one preload slot, and Triton's total fits."""
    from tilews.lowering.capabilities import SM90
    main = kernels("hopper")[1](2, 4, 4, 1000, 192, False, 1024, dtype=T.float16,
                                **dict(blocks(192, True), tail_units=64, tail_parts=2)).kernels[0]
    notes = main.report.notes
    again = [m for m in map(re.compile(
        r"hopper: the gluon backend's compiled program needs (\d+) bytes of shared memory, (\d+) "
        r"of them its toolchain's scratch beside the plan's (\d+), more than the (\d+) of target "
        r"'hopper'; lowered again for (\d+) bytes").fullmatch, notes) if m]
    assert len(again) == 1, notes
    needed, scratch, planned, limit, budget = map(int, again[0].groups())
    assert limit == SM90.smem_bytes < needed == planned + scratch and budget == limit - scratch
    assert any(n.startswith("warp_specialize: one slot for the preloads of each tile") and
               n.endswith(f"more than the {budget} of target 'hopper'") for n in notes), notes
    assert main.report.backend == "gluon" and "gl.warp_specialize(" in main.program.source
    assert main.report.shared_bytes <= budget
    assert main.program.metadata["shared"] <= SM90.smem_bytes


def test_split_roles_add_their_rows_on_the_interpreter():
    """The D64 kernel lowered for Hopper (2 SMs: persistent; one role per consumer warp group)
    at 4 units of 128 keys, the last in 3 parts, run on the interpreter (its race checks on):
    with the workspace cast as the second kernel does, the float64 gradients."""
    from tilews.lowering import interpreter
    from tilews.lowering.frontend import build_function
    from tilews.lowering.pipeline import lower
    from tilews.lowering.plans import ConsumerSplit
    from tilews.triton_ext.gluon.backend import HOPPER
    B, H, S, D = 1, 2, 256, 64
    q, k, v, do, o, lse = _inputs(B, H, H, S, D)
    rows = lse.shape[-1]
    delta, dq_acc = torch.empty_like(lse), torch.full((B, H, rows, D), float("nan"))
    kernels("interpret")[0](B, H, S, D, rows, dtype=T.float16)(o, do, delta, dq_acc)
    program = bwd_program(B, H, H, S, D, False, rows, dtype=T.float16,
                          **dict(blocks(D, True), tail_units=1, tail_parts=3))
    lowered = lower(build_function(program).kernels[0], HOPPER.replace(num_sms=2))
    assert lowered.find_plan(ConsumerSplit) is not None, lowered.notes
    dk, dv = (torch.full_like(t, float("nan")) for t in (k, v))
    dkv = torch.zeros(1, 2, 128, D)
    interpreter.run(lowered, [q, k, v, do, lse, delta, dq_acc, dk, dv, dkv], seed=1)
    dk[0, 1, 128:], dv[0, 1, 128:] = dkv[0, 0].half(), dkv[0, 1].half()   # unit 3's
    for name, got, w in zip("qkv", (dq_acc[:, :, :S], dk, dv), _reference(q, k, v, do, False, "bhsd")):
        assert _rel(got, w) < 2e-3, name


@pytest.mark.parametrize("dq_tile_add", [True, False], ids=["dq_by_tile", "dq_by_element"])
def test_split_tail_adds_each_element_once_at_head_dim_96(dq_tile_add):
    """Compile-only (sm_90a), the GPU test's D96 split (B2 H4 S1000, 64 units x 2 parts): the
    head dim runs as pieces of 64 and 32 columns (split_extents), each added in its own layout.
    The 32-column pieces' loops once ran in the 64-column pieces' layout (the two loops shared
    their variables' names, by which infer_layouts keys a loop's layout): converted into it, a
    thread held each element of dK's and dV's 32 columns twice, Triton 3.6's atomic added both
    (those columns doubled on an H200). The PTX adds each element of dK, dV [128, 96] once, and
    of dQ [64, 96] by element too where not by tile (the op's choice is by tile: one bulk
    reduce-add per piece): 48 (60) two-element atomics per consumer thread (256), no two alike."""
    from tilews.lowering.frontend import build_function
    from tilews.lowering.pipeline import lower
    from tilews.triton_ext.gluon import emit
    from tilews.triton_ext.gluon.backend import HOPPER

    from .helpers import gluon_program

    assert blocks(96, True)["dq_tile_add"]
    program = bwd_program(2, 4, 4, 1000, 96, False, 1024, dtype=T.float16,
                          **dict(blocks(96, True), tail_units=64, tail_parts=2, dq_tile_add=dq_tile_add))
    lowered = lower(build_function(program).kernels[0], HOPPER)
    source = emit(lowered)
    for piece in ("dk_64", "dv_64") + (() if dq_tile_add else ("dq_64",)):   # own layout, not converted
        assert re.search(rf"gl\.atomic_add\([^\n]*, {piece}, mask=", source), piece
    reduced = re.findall(r"async_reduce_add\(dQ_desc_(\d), \[[^\]]*, (\d+)\], dq_s_(\d+)\)", source)
    assert reduced == ([("0", "0", "0"), ("1", "64", "64")] if dq_tile_add else [])
    ptx = gluon_program(lowered).asm["ptx"]
    adds = re.findall(r"atom\.global\.gpu\.relaxed\.add\.v2\.f32 \{[^}]*\}, (\[[^\]]*\]), (\{[^}]*\})", ptx)
    assert len(adds) == ((0 if dq_tile_add else 64 * 96) + 2 * 128 * 96) // (256 * 2)
    assert len(set(adds)) == len(adds)


def test_an_atomic_in_a_layout_holding_elements_twice_is_refused(monkeypatch):
    """The D96 bug's class, put back (split_extents' loop pieces keeping the first piece's
    variable names): the Gluon emitter refuses the 32-column pieces' element atomics, which ran in
    the 64-column layout, as an internal error naming the buffer, instead of adding twice."""
    from tilews.lowering.errors import InternalError
    from tilews.lowering.frontend import build_function
    from tilews.lowering.passes import split_extents
    from tilews.lowering.pipeline import lower
    from tilews.triton_ext.gluon import emit
    from tilews.triton_ext.gluon.backend import HOPPER

    program = bwd_program(2, 4, 4, 1000, 96, False, 1024, dtype=T.float16,
                          **dict(blocks(96, True), tail_units=64, tail_parts=2))
    monkeypatch.setattr(split_extents._Rewriter, "renamed", lambda self, p, n: p)
    lowered = lower(build_function(program).kernels[0], HOPPER)
    with pytest.raises(InternalError, match=r"atomic add into 'd(Q|KV)'.*holds an element twice"):
        emit(lowered)
