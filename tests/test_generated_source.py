"""Goldens of generated code: every example kernel's emitted source, checked in.

Each case builds one example kernel (``examples/gemm.py``, ``examples/softmax.py``,
``examples/ws_gemm.py``, the attention program of ``tilews/ops/attention.py``) at one fixed shape
with ``tilews.jit(target=...)`` and compares ``kernel.get_kernel_source()`` with its entry in
``test_generated_source.expected``, so that a change in generated code shows up in review. Target
``"triton"`` gives the ``triton.language`` source; ``"metal"`` the MSL translation unit;
``"hopper"`` the warp-specialized Gluon source (compiled for sm_90a in a child process, no GPU
needed), or, for a program the Gluon path refuses, the ``triton.language`` fallback: each
entry starts with the report's target (``hopper -> triton``), so the fallback itself is pinned.

The journal is the one of ``tests/passes`` (``file.py:123`` normalized to ``file.py:N``);
``EXPECTTEST_ACCEPT=1 pytest tests/test_generated_source.py`` rewrites it.

What the machine would decide is pinned, so every machine records the same text: the ``triton``
target is the GPU's (on a CPU-only machine tilews would pick the interpreter's flavor of
``triton.language``, which legalize changes: f32 dot operands), and the multiprocessor count is
132 (an H100 SXM's, tilews's own default without a GPU; the persist pass reads it).
"""
from __future__ import annotations

import pytest

import tilews
from tilews import CompileError, targets
from tilews.lowering.backend import Machine

from examples.gemm import matmul, persistent_matmul
from examples.softmax import softmax
from examples.ws_gemm import pingpong_matmul_program, ws_matmul_program, ws_ring_matmul_program
from tilews.ops.attention import mha_fwd_program

from .passes.conftest import expect  # noqa: F401  (the golden-journal fixture)

NUM_SMS = 132

# name -> (example's kernel builder, args, kwargs, {target: the report's target there})
CASES = {
    # examples/gemm.py, fp16, one consumer warp group (automatic warp specialization on Hopper)
    "gemm": (matmul.fn, (256, 256, 256), dict(block_M=128, block_N=128, block_K=64),
             {"triton": "triton", "hopper": "hopper"}),
    # examples/gemm.py as its main() runs it on a GPU: 128x256 tiles, two consumer warp groups,
    # swizzle 16; 32x16 tiles > 132 SMs, so on Hopper the persist pass makes it persistent
    "gemm_main": (matmul.fn, (4096, 4096, 4096),
                  dict(block_M=128, block_N=256, block_K=64, threads=256, swizzle=16),
                  {"triton": "triton", "hopper": "hopper"}),
    # a swizzle over a grid of 2x4 tiles, fewer than the SMs (not persistent)
    "gemm_swizzle": (matmul.fn, (512, 512, 256),
                     dict(block_M=128, block_N=256, block_K=64, threads=256, swizzle=2),
                     {"triton": "triton", "hopper": "hopper"}),
    # examples/gemm.py's T.Persistent GEMM (bf16, 128x256x64): 8 tiles over 4 blocks
    "persistent_gemm": (persistent_matmul.fn, (512, 512, 256), dict(num_sms=4),
                        {"triton": "triton", "hopper": "hopper"}),
    # examples/softmax.py: no warp-specialized form, so Hopper compiles triton.language
    "softmax": (softmax.fn, (256, 128), {}, {"triton": "triton", "hopper": "hopper -> triton"}),
    # examples/ws_gemm.py: explicit producer T.ws(0) + merged consumer T.ws(1, 2), one buffer
    "ws_gemm": (ws_matmul_program, (256, 256, 256), dict(block_K=64),
                {"triton": "triton", "hopper": "hopper"}),
    # examples/ws_gemm.py's ring of full/empty barrier pairs (3 stages, swizzle 8; on triton the
    # 3-slot ring is a tensor of 4 slots, the fourth padding)
    "ws_ring_gemm": (ws_ring_matmul_program, (512, 512, 256), {},
                     {"hopper": "hopper", "triton": "triton"}),
    # examples/ws_gemm.py's persistent ping-pong (two consumers taking turns): Hopper only, see
    # test_no_triton_form
    "pingpong_gemm": (pingpong_matmul_program, (512, 512, 256), dict(num_sms=4),
                      {"hopper": "hopper"}),
    # Metal (MSL): the examples at tiles that fit its 32 KB of threadgroup memory, ragged shapes
    # (masked copies, the accumulator staged through scratch on its way out)
    "gemm_metal": (matmul.fn, (100, 72, 48), dict(block_M=32, block_N=32, block_K=16),
                   {"metal": "metal"}),
    "softmax_metal": (softmax.fn, (50, 64), {}, {"metal": "metal"}),
    "ws_gemm_metal": (ws_matmul_program, (64, 64, 48), dict(block_M=32, block_N=32, block_K=16),
                      {"metal": "metal"}),
    "attention_metal": (mha_fwd_program, (1, 2, 40, 32, True),
                        dict(block_M=16, block_N=16, num_stages=1, threads=128), {"metal": "metal"}),
}


@pytest.fixture
def pinned_machine(monkeypatch):
    """Compile as on an H100 SXM, whatever this machine is (the backends only read ``Machine``;
    nothing here launches a kernel)."""
    h100 = Machine(cuda=True, capability=(9, 0), num_sms=NUM_SMS)
    monkeypatch.setattr(targets, "machine", lambda: h100)


def build(name: str, target: str, **more) -> tilews.Kernel:
    fn, args, kwargs, _ = CASES[name]
    return tilews.jit(out_idx=[-1], target=target)(fn)(*args, **kwargs, **more)


@pytest.mark.parametrize("name,target", [pytest.param(n, t, id=f"{n}-{t}")
                                         for n, case in CASES.items() for t in case[3]])
def test_source(name, target, expect, pinned_machine):  # noqa: F811
    kernel = build(name, target)
    assert kernel.report.target == CASES[name][3][target], kernel.report.notes
    expect(f"# target: {kernel.report.target}\n{kernel.get_kernel_source()}")


@pytest.mark.parametrize("name,more,reason", [
    # its consumers take turns through barriers; in one stream the producer would wait for a
    # release that comes later in program order
    ("pingpong_gemm", {}, "no warp specialization"),
], ids=["pingpong_gemm"])
def test_no_triton_form(name, more, reason, pinned_machine):
    """The examples without a golden for target 'triton' are those it rejects; when one builds,
    give it a golden (add "triton" to its CASES entry)."""
    with pytest.raises(CompileError, match=reason):
        build(name, "triton", **more)
