"""scripts/peer_compare.py's attention cases (TileLang's backward, GQA decode and varlen forward
examples) and warp-specialized GEMM cases (the five ``warp_specialize`` GEMMs), built by tilews
alone at small sizes on the CPU (the interpreter) and checked against the cases' own float32
references: each case builds, runs and agrees with its reference before
the GPU compares it with TileLang. The examples are TileLang's files, never committed here: the
tests skip without ``.tilelang_suite/tilews`` (``python scripts/tilelang_suite.py fetch``, then any
``run`` writes it)."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

SCRIPTS = Path(__file__).resolve().parent.parent / "scripts"
sys.path.insert(0, str(SCRIPTS))

import peer_compare  # noqa: E402

pytestmark = pytest.mark.skipif(not (peer_compare.SUITE / "tilews/flash_attention").exists(),
                                reason="no .tilelang_suite/tilews (TileLang's examples)")

CASES = {
    "mha_bwd_kernel": lambda: peer_compare._attention_bwd(
        "example_mha_bwd_bhsd.py", "kernel", False, 1, 2, 128, 64, 64),
    "mha_bwd_causal": lambda: peer_compare._attention_bwd(
        "example_mha_bwd_bhsd.py", "backward", True, 1, 2, 128, 64, 64),
    "gqa_bwd_kernel_causal": lambda: peer_compare._attention_bwd(
        "example_gqa_bwd.py", "kernel", True, 1, 4, 128, 64, 32, groups=2),
    "gqa_bwd": lambda: peer_compare._attention_bwd(
        "example_gqa_bwd.py", "backward", False, 1, 4, 128, 64, 32, groups=2),
    "gqa_decode": lambda: peer_compare._gqa_decode(2, heads=8, kv_heads=2, seq=512, dim=32,
                                                   block_N=64, num_split=4, stages=1),
    "mha_fwd_varlen_causal": lambda: peer_compare._fwd_varlen(
        "example_mha_fwd_varlen.py", True, 3, 2, 96, 32, block_M=32, block_N=32, stages=1,
        threads=128),
    "gqa_fwd_varlen": lambda: peer_compare._fwd_varlen(
        "example_gqa_fwd_varlen.py", False, 3, 4, 96, 32, kv_heads=2, block_M=32, block_N=32,
        stages=1, threads=128),
    **{name: (lambda file=file, factory=factory: peer_compare._ws_gemm(file, factory, size=256))
       for name, (file, factory) in peer_compare.WS_GEMMS.items()},
}


@pytest.mark.parametrize("name", CASES)
def test_case_builds_runs_and_matches_its_reference_on_tilews(name, monkeypatch):
    monkeypatch.setattr(peer_compare, "DEVICE", "cpu")
    folder, file, build, inputs, reference, flops, *_ = CASES[name]()
    kernel = build(peer_compare.load("tilews", folder, file))
    args = inputs()
    want = [w.float() for w in reference(*args)]
    assert flops > 0
    assert peer_compare.max_rel_err(kernel(*args), want) < 2e-2       # fp16 inputs and outputs
