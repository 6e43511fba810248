"""The compiler lowers a kernel again where the toolchain's own shared-memory scratch (Triton's
layout conversions, beside our plan's arena) takes the loaded program past the machine's
(``tilews.compiler._take``): the passes then see ``smem_bytes`` less that scratch and choose what
fits. Here through the real compile path (disk cache included) with a Gluon backend whose loaded
programs run on the interpreter and count a scratch each test chooses, so the relowered program's
numbers are checked too; the real Triton case (the attention backward at head dim 192) is
``tests/test_attention_tail_split.py``."""
from __future__ import annotations

import pytest

import tilews
from tilews import backends
from tilews.lowering.errors import ResourceLimitError
from tilews.lowering.interpreter.backend import InterpreterProgram
from tilews.lowering.plans import SharedMemoryPlan
from tilews.triton_ext.gluon.backend import GluonBackend

from .helpers import marked_line, randn, rel_err
from .test_runtime import deep_ring_gemm

LIMIT = 232448      # Hopper's shared memory per block
GEMM = (256, 256, 256, 128, 128, 128, 1)
# its plan at LIMIT: a 2-slot ring of 128x128 A and B tiles (128 KB) and C's fp32 staging tile
# (64 KB); below 196640 bytes warp_specialize stores C from registers instead (131104)
STAGED, UNSTAGED = 196640, 131104


class ScratchyBackend(GluonBackend):
    """The Gluon backend's lowering; its programs run on the interpreter and need ``scratch(cap,
    planned)`` bytes beside their plan (``cap``: the smem_bytes they were lowered for)."""
    name = "scratchy"
    lowered_for: list[int] = []

    @staticmethod
    def scratch(cap: int, planned: int) -> int:
        return 0

    def lower(self, kernel, observe=None):
        type(self).lowered_for.append(self.config.caps.smem_bytes)
        return super().lower(kernel, observe)

    def load(self, lowered, source, options):
        return InterpreterProgram(lowered, source, 0, False)

    def shared_bytes(self, program) -> int:
        planned = program.kernel.find_plan(SharedMemoryPlan).total_bytes
        return planned + self.scratch(self.config.caps.smem_bytes, planned)


@pytest.fixture
def scratchy(monkeypatch, tmp_path):
    """Hopper's chain with ``ScratchyBackend`` for gluon, a fresh disk cache; returns a setter of
    its scratch."""
    monkeypatch.setenv("TILEWS_CACHE_DIR", str(tmp_path))
    monkeypatch.setitem(backends.BACKENDS, "gluon", (__name__, "ScratchyBackend"))
    monkeypatch.setattr(ScratchyBackend, "lowered_for", [])

    def set_scratch(fn):
        monkeypatch.setattr(ScratchyBackend, "scratch", staticmethod(fn))
    return set_scratch


def test_a_program_whose_scratch_overflows_is_lowered_again_for_less(scratchy):
    """50 KB of scratch beside the staged plan (196640 + 51200 > 232448): lowered again for
    232448 - 51200 bytes, where C is stored from registers; the program computes A @ B. A second
    compile finds both lowerings in the disk cache and ends in the second."""
    scratchy(lambda cap, planned: 50 * 1024)
    a, b = randn(256, 256, seed=1).half(), randn(256, 256, seed=2).half()
    kernels = []
    for _ in range(2):
        k = tilews.jit(out_idx=[-1], target="hopper")(deep_ring_gemm)(*GEMM)
        assert k.report.backend == "scratchy"
        assert f"hopper: the scratchy backend's compiled program needs {STAGED + 51200} bytes of " \
               f"shared memory, 51200 of them its toolchain's scratch beside the plan's {STAGED}, " \
               f"more than the {LIMIT} of target 'hopper'; lowered again for {LIMIT - 51200} " \
               f"bytes" in k.report.notes, k.report.notes
        assert any(n.startswith("warp_specialize: the epilogue stores from registers") and
                   f"more than the {LIMIT - 51200} of target 'hopper'" in n for n in k.report.notes)
        assert k.report.shared_bytes == UNSTAGED
        kernels.append(k)
    assert ScratchyBackend.lowered_for == [LIMIT, LIMIT - 51200]   # the second compile: all hits
    assert [k.report.cache_hit for k in kernels] == [False, True]
    for k in kernels:
        assert rel_err(k(a, b), a.double() @ b.double()) < 1e-3


def test_a_program_that_fits_is_lowered_once(scratchy):
    scratchy(lambda cap, planned: LIMIT - STAGED)      # exactly the machine's bytes
    k = tilews.jit(out_idx=[-1], target="hopper")(deep_ring_gemm)(*GEMM)
    assert ScratchyBackend.lowered_for == [LIMIT]
    assert k.report.shared_bytes == STAGED and not any("lowered again" in n for n in k.report.notes)


@pytest.mark.parametrize("scratch, caps, says", [
    # the excess does not shrink (1000 bytes at each cap): one relowering, then the limit
    (lambda cap, planned: LIMIT - planned + 1000, [LIMIT, STAGED - 1000],
     f"needs {LIMIT + 1000} bytes of shared memory, {LIMIT + 1000 - UNSTAGED} of them its "
     f"toolchain's scratch beside the plan's {UNSTAGED}, more than the {LIMIT} of target 'hopper' "
     f"(lowered for {STAGED - 1000} bytes)"),
    # it shrinks (4000, 2000, 1333 bytes) but never goes: MAX_RELOWERINGS, then the limit
    (lambda cap, planned: LIMIT - planned + {LIMIT: 4000, STAGED - 4000: 2000}.get(cap, 1333),
     [LIMIT, STAGED - 4000, UNSTAGED - 2000], "more than the 232448 of target 'hopper' (lowered for"),
    # the second lowering itself cannot fit what the scratch leaves
    (lambda cap, planned: 200 * 1024, [LIMIT, LIMIT - 200 * 1024],
     f"more than the {LIMIT - 200 * 1024} target 'hopper' has, lowered again because the "
     f"scratchy backend's compiled program needs {STAGED + 200 * 1024} bytes"),
])
def test_scratch_that_never_fits_is_a_resource_limit_at_the_kernels_line(scratchy, monkeypatch,
                                                                          scratch, caps, says):
    """Alone in the chain: a ResourceLimitError at the kernel's line saying what was tried; with
    tl after it (Hopper's chain): that backend's refusal, and tl compiles the kernel."""
    scratchy(scratch)
    monkeypatch.setitem(backends.CHAINS, "hopper", ("gluon",))
    with pytest.raises(ResourceLimitError) as e:
        tilews.jit(out_idx=[-1], target="hopper")(deep_ring_gemm)(*GEMM)
    assert says in e.value.message, e.value.message
    assert e.value.loc.line == marked_line(deep_ring_gemm, "with T.Kernel")
    assert ScratchyBackend.lowered_for == caps
    monkeypatch.setitem(backends.CHAINS, "hopper", ("gluon", "tl"))
    k = tilews.jit(out_idx=[-1], target="hopper")(deep_ring_gemm)(*GEMM)
    assert k.report.backend == "tl"
    assert any(n.startswith("hopper: the scratchy backend cannot fit the program (") and says in n
               and n.endswith("; using tl") for n in k.report.notes), k.report.notes
