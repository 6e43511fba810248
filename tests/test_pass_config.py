"""Pass configs (``tilews.pass_config``, ``tilews.jit(pass_configs=...)``) and the small TileLang
shims (``tilews.transform``, ``tilews.carver.arch.driver``).

* ``PassConfigKey`` members equal their strings; an unknown key or a non-bool switch is a
  ``ValueError`` naming it.
* Fast math: fp32 division and square root are IEEE-rounded by default (``div_rn``, ``sqrt_rn``)
  and Triton's approximate forms under ``tl.enable_fast_math``; both sources run right on Triton's
  CPU interpreter (target ``triton``), and on Hopper (compile-only) the PTX holds ``div.rn.f32`` /
  ``sqrt.rn.f32`` or ``div.full.f32`` / ``sqrt.approx``. The switch is part of the cache key.
* ``tl.disable_warp_specialized`` / ``tl.disable_tma_lower`` on Hopper: compiled with
  ``triton.language``, and the report says so; other keys are recorded in the report's notes.
"""
from __future__ import annotations

import re

import pytest
import torch

import tilews
import tilews.language as T
from tilews.pass_config import PassConfigKey, resolve

from .test_profiler import matmul


def ratio_kernel(n, block=64):
    """Y = X / (|X| + 1) + sqrt(|X|), in fp32."""
    @T.prim_func
    def main(X: T.Tensor((n,), T.float32), Y: T.Tensor((n,), T.float32)):
        with T.Kernel(T.ceildiv(n, block), threads=64) as bx:
            for i in T.Parallel(block):
                x = X[bx * block + i]
                Y[bx * block + i] = x / (T.abs(x) + 1.0) + T.sqrt(T.abs(x))
    return main


def gemm_epilogue(M, N, K, bm=128, bn=128, bk=64):
    """A Hopper GEMM whose epilogue divides and takes square roots of the fp32 accumulator."""
    @T.prim_func
    def main(A: T.Tensor((M, K), T.float16), B: T.Tensor((K, N), T.float16),
             C: T.Tensor((M, N), T.float32)):
        with T.Kernel(T.ceildiv(N, bn), T.ceildiv(M, bm), threads=256) as (bx, by):
            A_s = T.alloc_shared((bm, bk), T.float16)
            B_s = T.alloc_shared((bk, bn), T.float16)
            C_f = T.alloc_fragment((bm, bn), T.float32)
            T.clear(C_f)
            for k in T.Pipelined(T.ceildiv(K, bk), num_stages=3):
                T.copy(A[by * bm, k * bk], A_s)
                T.copy(B[k * bk, bx * bn], B_s)
                T.gemm(A_s, B_s, C_f)
            for i, j in T.Parallel(bm, bn):
                C_f[i, j] = C_f[i, j] / (T.abs(C_f[i, j]) + 3.0) + T.sqrt(T.abs(C_f[i, j]))
            T.copy(C_f, C[by * bm, bx * bn])
    return main


FAST = {PassConfigKey.TL_ENABLE_FAST_MATH: True}


def test_keys_equal_their_strings():
    assert PassConfigKey.TL_ENABLE_FAST_MATH == "tl.enable_fast_math"
    assert PassConfigKey.TL_DISABLE_TMA_LOWER == "tl.disable_tma_lower"
    assert PassConfigKey.TL_DISABLE_WARP_SPECIALIZED == "tl.disable_warp_specialized"
    assert PassConfigKey.TL_DISABLE_SAFE_MEMORY_ACCESS == "tl.disable_safe_memory_legalize"
    assert PassConfigKey("tl.config_index_bitwidth") is PassConfigKey.TL_CONFIG_INDEX_BITWIDTH
    assert f"{PassConfigKey.TL_ENABLE_FAST_MATH}" == "tl.enable_fast_math"
    from tilews.transform import PassConfigKey as FromTransform
    assert FromTransform is PassConfigKey


def test_resolve():
    assert resolve(None) == resolve({}) and not resolve(None).fast_math
    opts = resolve({"tl.enable_fast_math": True, PassConfigKey.TL_DISABLE_WARP_SPECIALIZED: True,
                    "tl.config_index_bitwidth": 64})
    assert opts.fast_math and not opts.warp_specialization
    assert opts.recorded == ("tl.config_index_bitwidth",)
    assert resolve({"tl.disable_warp_specialized": False}).warp_specialization


def test_unknown_key_is_an_error_listing_the_known_ones():
    with pytest.raises(ValueError, match=r"unknown key 'tl.enable_fastmath' \(did you mean "
                                         r"'tl.enable_fast_math'\?\); known keys: .*tl.disable_tma_lower"):
        resolve({"tl.enable_fastmath": True})
    with pytest.raises(ValueError, match="unknown key"):
        tilews.jit(out_idx=[-1], target="interpret", pass_configs={"tl.nope": 1})(ratio_kernel)(64)


def test_switch_values_must_be_bools():
    with pytest.raises(ValueError, match="tl.enable_fast_math: expected True or False, got 'yes'"):
        resolve({"tl.enable_fast_math": "yes"})


@pytest.mark.parametrize("value", [True, False])
def test_disable_tma_lower_is_deprecated(value):
    with pytest.warns(DeprecationWarning, match="tl.disable_tma_lower"):   # whatever its value
        assert resolve({PassConfigKey.TL_DISABLE_TMA_LOWER: value}).warp_specialization is not value


# ----------------------------------------------------------------------------------------------
# fast math


def _source_lines(k, what):
    return [line for line in k.get_kernel_source().splitlines() if what in line]


def test_fast_math_on_the_triton_target():
    x = torch.randn(256)
    ref = (x.double() / (x.double().abs() + 1) + x.double().abs().sqrt()).float()
    precise = tilews.jit(out_idx=[-1], target="triton")(ratio_kernel)(256)
    fast = tilews.jit(out_idx=[-1], target="triton", pass_configs=FAST)(ratio_kernel)(256)
    assert _source_lines(precise, "tl.math.div_rn(") and _source_lines(precise, "tl.sqrt_rn(")
    assert not _source_lines(fast, "div_rn") and not _source_lines(fast, "sqrt_rn")
    assert _source_lines(fast, "tl.sqrt(")
    assert any("tl.enable_fast_math: fp32 division and square root" in n for n in fast.report.notes)
    # both right: IEEE-rounded ops to an ulp; the approximate forms within 2 ulp each (a GPU;
    # Triton's CPU interpreter computes both exactly)
    torch.testing.assert_close(precise(x), ref, rtol=2e-7, atol=1e-7)
    torch.testing.assert_close(fast(x), ref, rtol=1e-6, atol=1e-6)


def test_fast_math_is_part_of_the_cache_key():
    first = tilews.jit(out_idx=[-1], target="triton")(ratio_kernel)(128)
    fast = tilews.jit(out_idx=[-1], target="triton", pass_configs=FAST)(ratio_kernel)(128)
    again = tilews.jit(out_idx=[-1], target="triton", pass_configs=FAST)(ratio_kernel)(128)
    assert not fast.report.cache_hit and fast.get_kernel_source() != first.get_kernel_source()
    assert again.report.cache_hit and again.get_kernel_source() == fast.get_kernel_source()


def test_fast_math_on_hopper_ptx():
    """Compile-only for sm_90a: the approximate and IEEE-rounded PTX instructions."""
    found = {}
    for fast in (False, True):
        k = tilews.jit(out_idx=[-1], target="hopper",
                       pass_configs={"tl.enable_fast_math": fast})(gemm_epilogue)(256, 256, 256)
        assert k.report.backend == "gluon"
        ptx = k.asm["ptx"]
        found[fast] = {op: set(re.findall(rf"\b{op}\.[a-z0-9.]+", ptx)) for op in ("div", "sqrt")}
    assert found[False] == {"div": {"div.rn.f32"}, "sqrt": {"sqrt.rn.f32"}}
    assert found[True]["div"] == {"div.full.f32"}
    assert found[True]["sqrt"] and all(s.startswith("sqrt.approx") for s in found[True]["sqrt"])


# ----------------------------------------------------------------------------------------------
# warp specialization off, recorded keys


@pytest.mark.parametrize("key", [PassConfigKey.TL_DISABLE_WARP_SPECIALIZED, "tl.disable_tma_lower"])
def test_hopper_without_warp_specialization_compiles_with_tl(key, recwarn):
    k = tilews.jit(out_idx=[-1], target="hopper", pass_configs={key: True})(matmul)(64, 64, 64)
    deprecated = key == PassConfigKey.TL_DISABLE_TMA_LOWER
    assert any(issubclass(w.category, DeprecationWarning) and "tl.disable_tma_lower" in str(w.message)
               for w in recwarn) == deprecated
    assert k.report.backend == "tl" and k.report.target == "hopper -> triton"
    assert any(n.startswith(f"{key}: the gluon backend (warp-specialized, TMA) is skipped")
               for n in k.report.notes)
    a, b = torch.randn(64, 64).half(), torch.randn(64, 64).half()
    torch.testing.assert_close(k(a, b).double(), a.double() @ b.double(), rtol=1e-2, atol=1e-2)


def test_warp_specialization_switch_elsewhere_has_no_effect():
    k = tilews.jit(out_idx=[-1], target="triton",
                   pass_configs={"tl.disable_warp_specialized": True})(matmul)(32, 32, 32)
    assert k.report.backend == "tl"
    assert ("tl.disable_warp_specialized: no effect: target 'triton' does not warp-specialize"
            in k.report.notes)


def test_register_copies_switch():
    # tl.enable_lower_ldgstg: the Gluon backend builds for a target with register_copies (so the
    # switch is in the cache key); the compile of the unaligned program itself is
    # test_gemm_schedules' and test_ws_oracle's
    assert resolve({"tl.enable_lower_ldgstg": True}).register_copies
    assert not resolve({"tl.enable_lower_ldgstg": False}).register_copies
    from tilews.backends import chain
    from tilews.lowering.backend import Services
    from tilews.lowering.settings import Settings
    services = Services(None, Settings.from_env())
    on = chain("hopper", services, resolve({"tl.enable_lower_ldgstg": True}))
    off = chain("hopper", services, resolve({}))
    assert [b.config.codegen.register_copies for b in on] == [True, True]
    assert [b.config.codegen.register_copies for b in off] == [False, False]
    assert on[0].fingerprint() != off[0].fingerprint()
    k = tilews.jit(out_idx=[-1], target="triton",
                   pass_configs={"tl.enable_lower_ldgstg": True})(matmul)(32, 32, 32)
    assert "tl.enable_lower_ldgstg: no effect: target 'triton' has no TMA producer" in k.report.notes


def test_other_keys_are_recorded():
    k = tilews.jit(out_idx=[-1], target="interpret",
                   pass_configs={PassConfigKey.TL_CONFIG_INDEX_BITWIDTH: 64,
                                 "tl.disable_safe_memory_legalize": True})(ratio_kernel)(64)
    assert "pass config tl.config_index_bitwidth has no tilews meaning; recorded" in k.report.notes
    assert "pass config tl.disable_safe_memory_legalize has no tilews meaning; recorded" in k.report.notes
    assert "tl.config_index_bitwidth" in str(k.report)


def test_carver_driver_num_sms():
    from tilews.carver.arch import driver
    assert driver.get_num_sms() == tilews.num_sms() > 0
