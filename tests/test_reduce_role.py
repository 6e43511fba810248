"""reduce_role: the D128 attention backward's dQ reduce-adds go out from a reducer warp of their
own; the merged consumer stores dQ's tile, fences and hands it over with its ring release, and
waits for the reducer's hand-back before the next store.

The lowered kernels run on the interpreter (roles concurrently, races checked) and give the
float64 gradients; compile-only, the consumer's loop issues no reduce-add and the reducer's
does, and the loop keeps its barriers and its freedom from spills."""
from __future__ import annotations

import re

import pytest

from tilews.lowering import ir
from tilews.lowering.traverse import walk

from .test_take_turns import FORMS, gives_the_float64_gradients, lowered_backward


def _lowered(B, H, S, D, causal, sms, reduce_role=True, **extra):
    return lowered_backward(B, H, S, D, causal, sms, dict(reduce_role=reduce_role), **extra)


def _roles(kernel):
    ws = next(s for s in kernel.body.stmts if isinstance(s, ir.WarpSpecialize))
    return {r.warpgroups: r for r in ws.roles}


@FORMS
def test_reducer_gives_the_float64_gradients(causal, extra):
    """The lowered kernel has the reducer warp, the consumer's release hands dQ's tile over, and
    the kernel gives the float64 gradients."""
    B, H, S, D = 1, 2, 384, 128
    lowered = _lowered(B, H, S, D, causal, 3, **extra)
    assert any(n.startswith("reduce_role: the bulk reduce-adds of dq_s") for n in lowered.notes), lowered.notes
    reducer = _roles(lowered)[(3,)]
    assert reducer.num_warps == 1 and lowered.threads == 512
    releases = [s for s in walk(_roles(lowered)[(1, 2)].body) if isinstance(s, ir.BarrierArrive)
                and s.barrier.buffer.name == "empty_dO_s"]
    assert len(releases) == 1 and releases[0].after_role_barrier     # it hands dQ's tile over
    gives_the_float64_gradients(lowered, B, H, S, D, causal, extra)


def test_off_and_where_it_does_not_apply():
    """With the policy off the merged consumer adds dQ itself; D64's split roles (one dQ partial
    each, two consumer roles) keep their own adds."""
    off = _lowered(1, 2, 384, 128, False, 3, reduce_role=False)
    assert set(_roles(off)) == {(0,), (1, 2)} and off.threads == 384
    d64 = _lowered(1, 2, 384, 64, False, 3)
    assert (3,) not in _roles(d64) and not any(n.startswith("reduce_role") for n in d64.notes)


def test_reducer_kernel_on_sm90a():
    """Compile-only, the op's D128 shape (B4 H32 S4096, persistent on 132 SMs): the reducer is a
    one-warp partition issuing the reduce-adds; the consumer waits for the hand-back and issues
    none; its loop keeps 3 block barriers (the one before the release also covers dQ's store)
    and no spills."""
    from tilews.triton_ext.gluon import emit
    from tilews.triton_ext.toolchain import ptxas_report, sass

    from .helpers import gluon_program, innermost_loops
    lowered = _lowered(4, 32, 4096, 128, False, 132)
    source = emit(lowered)
    functions = {m.group(1): m.group(0) for m in re.finditer(r"def (main_ws[\d_]+)\(.*?(?=\n\n\n)", source, re.S)}
    assert "async_reduce_add" not in functions["main_ws1_2"]
    assert "mbarrier.wait(dq_s_drained.index(0)" in functions["main_ws1_2"]
    assert "async_reduce_add" in functions["main_ws3"] and "mbarrier.arrive(dq_s_drained" in functions["main_ws3"]
    assert "(main_ws3, " in source and "[1, 1], [24, 24])" in source
    ptx = gluon_program(lowered).asm["ptx"]
    report = ptxas_report(ptx)
    if report is None:
        pytest.skip("this Triton bundles no ptxas")
    loop = max(innermost_loops(sass(ptx)), key=len)
    assert not [op for op in loop if op.startswith(("STL", "LDL", "UTMAREDG"))], loop
    assert sum(op.startswith("BAR.SYNC") for op in loop) == 3
    assert sum(op.startswith("HGMMA") for op in loop) == 32


def test_d256_takes_the_reducer_without_new_spills():
    """Compile-only, D256 (the merged consumer adds a 64 x 256 tile): the reducer applies, the
    consumer's loop issues no reduce-add and spills no more than without the pass."""
    from tilews.triton_ext.toolchain import ptxas_report, sass

    from .helpers import gluon_program, innermost_loops
    loops = {}
    for on in (False, True):
        lowered = _lowered(4, 32, 4096, 256, False, 132, reduce_role=on)
        assert ((3,) in _roles(lowered)) == on, lowered.notes
        ptx = gluon_program(lowered).asm["ptx"]
        if ptxas_report(ptx) is None:
            pytest.skip("this Triton bundles no ptxas")
        loops[on] = max(innermost_loops(sass(ptx)), key=len)
    assert not [op for op in loops[True] if op.startswith("UTMAREDG")]
    spills = {on: sum(op.startswith(("STL", "LDL")) for op in loop) for on, loop in loops.items()}
    assert spills[True] <= spills[False] and len(loops[True]) < len(loops[False]), spills
