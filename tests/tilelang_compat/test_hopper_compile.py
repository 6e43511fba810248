"""The examples compiled for ``target="hopper"`` on a machine without a GPU: which reach the Gluon
backend (warp-specialized, TMA) and which fall back to triton.language, with the reason in the
report's notes. Each program is built by its module's ``*_for("hopper")`` at the sizes a GPU run
would use; nothing is launched."""
import pytest

import tilews.language as T

from .test_flash_attention import flashattn_bhsd_for
from .test_gemm_fp8 import fp8_2xacc_matmul_for
from .test_layernorm import layernorm_kernels_for
from .test_rms_norm import rms_norm_for, rms_norm_splitk_for
from .test_warp_specialize import PROGRAMS as WS_GEMMS

GLUON = "hopper"
TL = "hopper -> triton"
REFUSED = "the gluon backend refused the program"
NOTHING_TO_SPECIALIZE = f"{REFUSED} (the program has no warp-specialized form"
TMA_LOWER_OFF = "tl.disable_tma_lower: the gluon backend (warp-specialized, TMA) is skipped"
TMA_LOWER_ON = {"tl.disable_tma_lower": False}


def ws_gemm(name):
    return lambda: WS_GEMMS[name]("hopper").compile(M=1024, N=1024, K=512, block_M=128,
                                                    block_N=128, block_K=64)


def mha_fwd_bhsd(is_causal):
    return lambda: flashattn_bhsd_for("hopper")(1, 2, 256, 256, 64, is_causal, block_M=128,
                                                block_N=128, num_stages=2, threads=256)


# name -> (build the kernel, the report's target, the fragments one of its notes holds)
CASES = {
    **{name: (ws_gemm(name), GLUON, ()) for name in WS_GEMMS if name != "copy_gemm_0_1"},
    # each role copies its own B tile with a plain copy and reads it: no barrier to complete it on
    "copy_gemm_0_1": (ws_gemm("copy_gemm_0_1"), TL,
                      (REFUSED, "is not followed by a barrier arrival that could complete it "
                                "asynchronously")),
    # no roles, no pipelined gemm: nothing to specialize
    "layernorm_fwd": (lambda: layernorm_kernels_for("hopper")[0](1024, 1024), TL,
                      (NOTHING_TO_SPECIALIZE,)),
    "layernorm_bwd": (lambda: layernorm_kernels_for("hopper")[1](1024, 1024, 32), TL,
                      (NOTHING_TO_SPECIALIZE,)),
    # the rms_norm examples turn TMA lowering off, which skips Gluon; with it on, Gluon refuses them
    "rms_norm": (lambda: rms_norm_for("hopper").compile(M=1024, N=1024, blk_m=1), TL,
                 (TMA_LOWER_OFF,)),
    "rms_norm_splitk": (
        lambda: rms_norm_splitk_for("hopper").compile(M=1024, N=1024, blk_m=1, blk_k=512),
        TL, (TMA_LOWER_OFF,)),
    "rms_norm_tma_lower_on": (
        lambda: rms_norm_for("hopper").with_pass_configs(TMA_LOWER_ON).compile(M=1024, N=1024,
                                                                               blk_m=1),
        TL, (NOTHING_TO_SPECIALIZE,)),
    "rms_norm_splitk_tma_lower_on": (
        lambda: rms_norm_splitk_for("hopper").with_pass_configs(TMA_LOWER_ON).compile(
            M=1024, N=1024, blk_m=1, blk_k=512),
        TL, (NOTHING_TO_SPECIALIZE,)),
    "mha_fwd_bhsd_full": (mha_fwd_bhsd(False), GLUON, ()),
    "mha_fwd_bhsd_causal": (mha_fwd_bhsd(True), GLUON, ()),
    "gemm_fp8_2xacc": (lambda: fp8_2xacc_matmul_for("hopper").compile(
        M=1024, N=1024, K=1024, block_M=128, block_N=128, block_K=64, dtype=T.float8_e4m3fn),
        GLUON, ()),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_compiles_for_hopper(name):
    build, route, fragments = CASES[name]
    kernel = build()
    assert kernel.report.target == route, kernel.report.notes
    if fragments:
        assert any(all(f in n for f in fragments) for n in kernel.report.notes), kernel.report.notes
