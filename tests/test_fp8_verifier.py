"""The FP8 verifier (``triton_ext/passes/fp8_verifier.py``): real FP8 GEMMs pass, edited ones fail.

Two tilews FP8 GEMMs are lowered for ``HOPPER`` and compiled for sm_90a without a GPU: a
per-tensor-style one (B given as [N, K], ``transpose_B=True``; one accumulator carried across the
k loop) and a block-scaled one (each 128-wide k step a fresh ``gemm(clear_accum=True)``, scaled and
added into an fp32 accumulator). The verifier reads ``asm["ttgir"]``; a violating module is that
text edited: a shared layout's ``transposed`` flipped (rule 1), the block-scaled wgmma's useC made
true or its A tile 256 wide (rule 2). (A real N-major FP8 GEMM, which Triton alone fails to lower,
never reaches the hook: legalize_wgmma refuses it first, tests/test_fp8.py.) ``compile.py`` runs
the hook with the spec's ``fp8_promote_every``.
"""
from __future__ import annotations

import functools
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import tilews.language as T
from tilews.lowering.errors import CompileError
from tilews.lowering.frontend import build_kernel
from tilews.lowering.pipeline import lower
from tilews.lowering.plans import AsyncPlan
from tilews.triton_ext.gluon.backend import HOPPER
from tilews.triton_ext import passes

from .helpers import gluon_program

COMPILE_SCRIPT = Path(passes.__file__).parents[1] / "gluon" / "compile.py"
M, N, K = 256, 256, 512
NVMMA_8BIT = "#ttg.nvmma_shared<{{swizzlingByteWidth = 128, transposed = {}, elementBitWidth = 8}}>"
A_ALIAS = "#shared = " + NVMMA_8BIT.format("false")       # K-major A: [M, K], K contiguous
B_ALIAS = "#shared3 = " + NVMMA_8BIT.format("true")       # K-major B: [K, N], K contiguous
FP8_DOT = re.compile(r"^.* = ttng\.warp_group_dot .*$", re.M)


def fp8_gemm(bm=128, bn=128, bk=128):
    fp8 = T.float8_e4m3

    @T.prim_func
    def main(A: T.Tensor((M, K), fp8), B: T.Tensor((N, K), fp8), C: T.Tensor((M, N), T.bfloat16)):
        with T.Kernel(T.ceildiv(N, bn), T.ceildiv(M, bm), threads=256) as (bx, by):
            A_s = T.alloc_shared((bm, bk), fp8)
            B_s = T.alloc_shared((bn, bk), fp8)
            C_f = T.alloc_fragment((bm, bn), T.float32)
            T.clear(C_f)
            for k in T.Pipelined(T.ceildiv(K, bk), num_stages=3):
                T.copy(A[by * bm, k * bk], A_s)
                T.copy(B[bx * bn, k * bk], B_s)
                T.gemm(A_s, B_s, C_f, transpose_B=True)
            T.copy(C_f, C[by * bm, bx * bn])
    return main


def block_scaled_gemm(bm=128, bn=128, bk=128):
    fp8 = T.float8_e4m3

    @T.prim_func
    def main(A: T.Tensor((M, K), fp8), SA: T.Tensor((M, K // 128), T.float32),
             B: T.Tensor((N, K), fp8), SB: T.Tensor((N // 128, K // 128), T.float32),
             C: T.Tensor((M, N), T.bfloat16)):
        with T.Kernel(T.ceildiv(N, bn), T.ceildiv(M, bm), threads=256) as (bx, by):
            A_s = T.alloc_shared((bm, bk), fp8)
            B_s = T.alloc_shared((bn, bk), fp8)
            C_f = T.alloc_fragment((bm, bn), T.float32)
            P_f = T.alloc_fragment((bm, bn), T.float32)
            sa = T.alloc_fragment((bm,), T.float32)
            T.clear(C_f)
            for k in T.Pipelined(T.ceildiv(K, bk), num_stages=3):
                T.copy(A[by * bm, k * bk], A_s)
                T.copy(B[bx * bn, k * bk], B_s)
                T.gemm(A_s, B_s, P_f, transpose_B=True, clear_accum=True)
                for i in T.Parallel(bm):
                    sa[i] = SA[by * bm + i, k]
                for i, j in T.Parallel(bm, bn):
                    C_f[i, j] += P_f[i, j] * sa[i] * SB[bx, k]
            T.copy(C_f, C[by * bm, bx * bn])
    return main


KERNELS = {"per_tensor": fp8_gemm, "block_scaled": block_scaled_gemm}


@functools.lru_cache(maxsize=None)
def program(name: str, overlap_promotion: bool = False):
    # one consumer role, the promotion after its wgmma: one FP8 wgmma per module, the text the
    # edits below expect
    return gluon_program(lower(build_kernel(KERNELS[name]()), HOPPER.replace(
        split_consumers=False, overlap_promotion=overlap_promotion)))


def ttgir(name: str) -> str:
    return program(name).asm["ttgir"]


def rejected(text: str, promote_every: int = 0) -> str:
    with pytest.raises(CompileError) as e:
        passes.verify_fp8(text, "main", promote_every)
    msg = str(e.value)
    assert msg.startswith("FP8 verifier: kernel 'main': FP8 wgmma `%"), msg
    return msg


def the_dot(text: str) -> str:
    dots = FP8_DOT.findall(text)
    assert len(dots) == 1 and "f8E4M3FN" in dots[0]
    return dots[0]


@pytest.mark.parametrize("name, promote_every", [("per_tensor", 0), ("block_scaled", 0),
                                                 ("block_scaled", 128)])
def test_real_modules_pass(name, promote_every):
    text = ttgir(name)
    assert A_ALIAS in text and B_ALIAS in text and passes.fp8_verifier.has_fp8_dot(text)
    passes.verify_fp8(text, "main", promote_every)


def test_promotion_under_the_next_wgmma_passes():
    """overlap_promotion's loop: the k-blocks' wgmmas into two partials by turns, each product
    fresh (``use_acc`` false), so every chain covers one k-block."""
    text = program("block_scaled", True).asm["ttgir"]
    dots = FP8_DOT.findall(text)
    assert len(dots) > 1 and all(", %false {" in d for d in dots), dots
    passes.verify_fp8(text, "main", 128)


def test_accumulator_carried_across_the_k_loop_fails_promotion():
    msg = rejected(ttgir("per_tensor"), promote_every=128)
    assert "accumulates more than promote_every = 128 elements of K" in msg
    assert re.search(r"carried across iterations of the scf\.for \(iter_arg %\w+\)", msg)


@pytest.mark.parametrize("edit", ["B_n_major", "A_m_major", "B_inline_n_major", "B_swizzled"])
def test_shared_operand_not_k_major_fails(edit):
    text = ttgir("per_tensor")
    dot = the_dot(text)
    if edit == "B_n_major":
        bad = text.replace(B_ALIAS, B_ALIAS.replace("transposed = true", "transposed = false"))
    elif edit == "A_m_major":
        bad = text.replace(A_ALIAS, A_ALIAS.replace("transposed = false", "transposed = true"))
    else:
        layout = NVMMA_8BIT.format("false") if edit == "B_inline_n_major" else "#shared2"
        assert dot.count("#shared3") == 1
        bad = text.replace(dot, dot.replace("#shared3", layout))
    assert bad != text
    operand = "A" if edit == "A_m_major" else "B"
    msg = rejected(bad)
    assert f"reads operand {operand} from shared memory that is not K-major" in msg
    assert "rule (1)" in msg


def test_register_A_operand_is_not_checked():
    text = ttgir("per_tensor")
    dot = the_dot(text)
    a_type = re.search(r": (!ttg\.memdesc<128x128xf8E4M3FN, #shared, #smem, mutable>) \*", dot).group(1)
    register = "tensor<128x128xf8E4M3FN, #ttg.dot_op<{opIdx = 0, parent = #mma, kWidth = 4}>>"
    flipped = text.replace(A_ALIAS, A_ALIAS.replace("transposed = false", "transposed = true"))
    rejected(flipped)
    passes.verify_fp8(flipped.replace(dot, dot.replace(a_type, register)), "main")


@pytest.mark.parametrize("edit", ["use_accumulator", "K_256"])
def test_block_scaled_chain_longer_than_promote_every_fails(edit):
    text = ttgir("block_scaled")
    dot = the_dot(text)
    if edit == "use_accumulator":       # the wgmma adds onto the previous step's partial product
        assert dot.count(", %false {") == 1
        bad_dot = dot.replace(", %false {", ", %true {")
        want = r"carried across iterations of the scf\.for \(iter_arg %\w+\)"
    else:                               # one wgmma spans 256 elements of K
        assert dot.count(": !ttg.memdesc<128x128xf8E4M3FN") == 1
        bad_dot = dot.replace(": !ttg.memdesc<128x128xf8E4M3FN", ": !ttg.memdesc<128x256xf8E4M3FN")
        want = r"its chain covers K = 256$"
    msg = rejected(text.replace(dot, bad_dot), promote_every=128)
    assert "accumulates more than promote_every = 128 elements of K" in msg and "rule (2)" in msg
    assert re.search(want, msg), msg


def compile_spec(tmp_path, spec: dict, cache: Path) -> dict:
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_CACHE_DIR"] = str(cache)
    env["PYTHONPATH"] = os.pathsep.join(os.path.abspath(p or ".") for p in sys.path)
    proc = subprocess.run([sys.executable, str(COMPILE_SCRIPT), str(tmp_path / "spec.json"),
                           str(tmp_path / "out.json")], capture_output=True, text=True, env=env,
                          timeout=600, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads((tmp_path / "out.json").read_text())


def test_compile_py_checks_promotion_from_its_spec(tmp_path):
    """The same per-tensor kernel: an old spec (no ``fp8_promote_every``) compiles and fills
    Triton's cache; with ``fp8_promote_every=128`` the hook runs again (another cache folder) and
    compile.py reports its finding."""
    prog = program("per_tensor")
    (tmp_path / "kernel.py").write_text(prog.source)
    spec = {"source": str(tmp_path / "kernel.py"), "fn": "main", "args_fn": "main_args",
            "num_warps": prog.kernel.plan(AsyncPlan).num_warps, "target": ["cuda", 90, 32],
            "params": [{"kind": "buffer", "shape": s, "dtype": d} for s, d in
                       (([M, K], "float8_e4m3fn"), ([N, K], "float8_e4m3fn"), ([M, N], "bfloat16"))]}
    cache = tmp_path / "triton-cache"
    plain = compile_spec(tmp_path, spec, cache)
    assert "verifier_error" not in plain and "ttng.warp_group_dot" in plain["asm"]["ttgir"]
    found = compile_spec(tmp_path, {**spec, "fp8_promote_every": 128}, cache)
    assert re.match(r"FP8 verifier: kernel 'main': FP8 wgmma `%\w+ = ttng\.warp_group_dot ",
                    found["verifier_error"])
    assert "promote_every = 128" in found["verifier_error"] and found["notes"] == []
    key = passes.cache_key_part()
    assert {p.name for p in cache.iterdir()} == {key, f"{key}-fp8-promote-128"}
