"""The GEMM with a fused bias + activation epilogue (``tilews/ops/epilogue.py``) on the Hopper
path, without a GPU.

* Oracle: the frontend program equals the lowered Hopper program bit for bit under random
  interpreter schedules, for relu / gelu / silu, ragged M / N / K that TMA still takes (rows a
  multiple of 16 bytes), one and two consumer warp groups, and persistent grids (the ``persist``
  pass, with a target of 4 SMs); the reference is checked against float64 torch. Shapes TMA
  cannot take are refused with the reason and fall back to triton.language.
* Compile-only sm_90a: the bias is loaded by the consumer partition, straight into the
  accumulator's register layout (inside the tile loop when persistent), never by the producer;
  wgmma and the TMA store are there.
* ``tilews.ops.matmul_bias_act`` on the CPU against float64 torch, per activation.
"""
from __future__ import annotations

import dataclasses
import functools
import re

import pytest
import torch

import tilews
import tilews.language as T
from tilews.lowering import ir
from tilews.lowering.errors import CompileError
from tilews.lowering.frontend import build_kernel
from tilews.lowering.pipeline import lower
from tilews.lowering.plans import AsyncPlan, AsyncRefusal
from tilews.triton_ext.gluon.backend import HOPPER
from tilews.lowering.traverse import exprs_of, subexprs, walk
from tilews.ops import matmul_bias_act
from tilews.ops.epilogue import matmul_epilogue

from .helpers import gluon_program, randn, rel_err
from .test_ws_oracle import assert_same_under_schedules, run_interp

SEEDS = range(20)
_T = {torch.float16: T.float16, torch.bfloat16: T.bfloat16}
SMALL = dict(block_M=64, block_N=32, block_K=32, num_stages=2, threads=128)


def activation(x: torch.Tensor, name: str) -> torch.Tensor:
    if name == "relu":
        return torch.relu(x)
    if name == "gelu":
        return torch.nn.functional.gelu(x, approximate="tanh")
    if name == "silu":
        return torch.nn.functional.silu(x)
    assert name == "none"
    return x


def reference(a, b, bias, name, alpha):
    return activation(alpha * (a.double() @ b.double()) + bias.double(), name)


def inputs(M, N, K, dtype, seed):
    return (randn(M, K, dtype=dtype, seed=seed), randn(K, N, dtype=dtype, seed=seed + 1),
            randn(N, dtype=dtype, seed=seed + 2))


@dataclasses.dataclass(frozen=True)
class Epi:
    M: int
    N: int
    K: int
    act: str
    alpha: float = 1.0
    dtype: torch.dtype = torch.bfloat16
    sms: int = 0                     # the target's SMs (0: unknown, never persistent)
    blocks: tuple = tuple(SMALL.items())

    def prim(self):
        return matmul_epilogue.fn(self.M, self.N, self.K, self.act, self.alpha, dtype=_T[self.dtype],
                                  **dict(self.blocks))

    @property
    def tiles(self):
        b = dict(self.blocks)
        return -(-self.M // b["block_M"]) * -(-self.N // b["block_N"])

    def __str__(self):
        return (f"{self.act}-{self.M}x{self.N}x{self.K}-a{self.alpha}-{str(self.dtype)[6:]}"
                f"-sms{self.sms}-t{dict(self.blocks)['threads']}")


ORACLE = [
    # ragged M, N and K (rows of A, B and C stay multiples of 16 bytes)
    Epi(200, 88, 104, "relu", alpha=-0.75),
    Epi(130, 72, 96, "gelu", alpha=1.5),
    Epi(136, 40, 72, "silu", dtype=torch.float16),
    # persistent: 4 x 3 = 12 tiles (resp. 3 x 3 = 9) over 4 SMs, uneven among the blocks
    Epi(200, 88, 104, "relu", alpha=0.5, sms=4),
    Epi(130, 72, 96, "gelu", sms=4, dtype=torch.float16),
    Epi(136, 80, 72, "silu", alpha=-1.25, sms=4),
    # two consumer warp groups (merged role, M split), persistent over 3 SMs
    Epi(200, 96, 104, "gelu", sms=3, blocks=tuple(dict(SMALL, block_M=128, threads=256).items())),
]


@pytest.mark.parametrize("case", ORACLE, ids=str)
def test_oracle_before_equals_after(case):
    before = build_kernel(case.prim())
    after = lower(before, HOPPER.replace(num_sms=case.sms))
    assert after.find_plan(AsyncPlan) is not None, after.find_plan(AsyncRefusal)
    persistent = [s for s in walk(after.body) if isinstance(s, ir.For) and s.kind is ir.ForKind.PERSISTENT]
    if case.sms:
        assert case.tiles > case.sms
        assert [ir.as_int(g) for g in after.grid] == [case.sms]
        assert any(n.startswith(f"persist: {case.tiles} tiles > {case.sms} SMs") for n in after.notes)
        assert len(persistent) == 2              # one tile loop per role
    else:
        assert not persistent and len(after.grid) == 2
    args = list(inputs(case.M, case.N, case.K, case.dtype, seed=7)) + [torch.empty(case.M, case.N, dtype=case.dtype)]
    want = run_interp(before, args, 3)
    assert not want.isnan().any()
    ref = reference(*args[:3], case.act, case.alpha)
    assert rel_err(want, ref) < 1e-2
    # the activation matters: without it the result is far off
    if case.act != "none":
        assert rel_err(want, reference(*args[:3], "none", case.alpha)) > 0.05
    for seed in SEEDS:
        got = run_interp(after, args, 3, seed)
        assert torch.equal(got, want), f"{case} seed {seed}: after passes differs from before"


def test_bias_is_read_in_the_consumer_role():
    after = lower(build_kernel(Epi(200, 88, 104, "gelu", sms=4).prim()), HOPPER.replace(num_sms=4))
    ws = next(s for s in walk(after.body) if isinstance(s, ir.WarpSpecialize))
    producer, consumer = ws.roles

    def bias_reads(r):
        return [x for s in walk(r.body) for x in _loads(s) if x.buffer.name == "Bias"]
    assert bias_reads(producer) == [] and bias_reads(consumer)
    assert dict(after.plan(AsyncPlan).pointer_params) == {"Bias": ((1,),)}
    # the epilogue runs after the k loop, inside the consumer's tile loop
    tile_loop = consumer.body.stmts[0]
    assert tile_loop.kind is ir.ForKind.PERSISTENT
    kinds = [type(s).__name__ for s in tile_loop.body.stmts]
    assert kinds.index("For") < kinds.index("Parallel") < len(kinds) - 1


def _loads(s):
    return [x for e in exprs_of(s) for x in subexprs(e) if isinstance(x, ir.Load)]


@pytest.mark.parametrize("K", [100, 98])
def test_rows_tma_cannot_take_fall_back_with_the_reason(K):
    # bf16 rows of K = 100 (98) elements are 200 (196) bytes: no bulk copy; target "hopper"
    # compiles through triton.language and says why
    M, N = 130, 72
    after = lower(build_kernel(Epi(M, N, K, "silu").prim()), HOPPER)
    assert after.find_plan(AsyncPlan) is None
    assert f"rows of 'A' are {2 * K} bytes, not a multiple of 16" in after.plan(AsyncRefusal).reason
    k = tilews.jit(out_idx=[-1], target="hopper")(matmul_epilogue.fn)(M, N, K, "silu", 1.0, **SMALL)
    assert k.target == "hopper -> triton"
    assert any(f"rows of 'A' are {2 * K} bytes" in n and n.endswith("; using tl") for n in k.report.notes)
    a, b, bias = inputs(M, N, K, torch.bfloat16, seed=11)
    assert rel_err(k(a, b, bias), reference(a, b, bias, "silu", 1.0)) < 1e-2


# ----------------------------------------------------------------------------------------------
# compile-only sm_90a


COMPILED = {
    # default GPU blocks: 128 x 256 x 64, a merged consumer of two warp groups, 3 stages
    "gelu_4x8_tiles": (Epi(1024, 1024, 512, "gelu", blocks=()), 0),
    # 32 tiles over 4 SMs: persistent
    "silu_persistent": (Epi(1024, 1024, 512, "silu", blocks=()), 4),
}


@functools.lru_cache(maxsize=None)
def compiled(name):
    case, sms = COMPILED[name]
    k = lower(build_kernel(case.prim()), HOPPER.replace(num_sms=sms))
    assert k.find_plan(AsyncPlan) is not None
    return k, gluon_program(k)


def count(pattern, text):
    return len(re.findall(pattern, text))


@pytest.mark.parametrize("name", sorted(COMPILED))
def test_compiled_epilogue(name):
    (case, sms), (k, p) = COMPILED[name], compiled(name)
    ttgir, ptx, src = p.asm["ttgir"], p.asm["ptx"], p.source
    assert "from triton.experimental import gluon" in src
    assert count(r"ttg\.warp_specialize\(", ttgir) == 1
    default = ttgir[ttgir.index("ttg.warp_specialize("):ttgir.index("partition0(")]
    producer = ttgir[ttgir.index("partition0("):]
    # the bias: a global load by the consumer (the default partition), in the accumulator's
    # own layout (#mma: no conversion before the add), and none by the producer
    bias_load = re.compile(r"tt\.load %\S+, %\S+, %\S+ : tensor<1x256x!tt\.ptr<bf16>, (#mma\d*)>")
    loads = bias_load.findall(default)
    assert loads and count(r"tt\.load ", producer) == 0
    # the user's `x` (which holds the bias) is used several times by GELU / SiLU: the bias is
    # still loaded once per element
    assert len(loads) == 1 and src.count("gl.load(Bias") == 1
    acc_type = re.search(r"ttng\.warp_group_dot [^\n]* -> tensor<128x256xf32, (#mma\d*)>", default)
    assert acc_type and set(loads) == {acc_type.group(1)}
    # the producer's only global reads are the two TMA loads
    assert count(r"ttng\.async_tma_copy_global_to_local", producer) == 2
    # wgmma: each of the 2 consumer warp groups computes a 64 x 256 slab: block_K / 16 = 4
    assert count(r"wgmma\.mma_async\.sync\.aligned\.m64n256k16\.f32\.bf16\.bf16", ptx) == 4
    # the epilogue stores by TMA, after a proxy fence
    assert count(r"ttng\.async_tma_copy_local_to_global", default) == 1
    store = re.search(r"cp\.async\.bulk\.tensor\.2d\.global\.shared::cta\.bulk_group", ptx)
    fence = re.search(r"fence\.proxy\.async\.shared::cta", ptx)
    assert store and fence and fence.start() < store.start()
    assert count(r"\b(ld|st)\.local\b", ptx) == 0, "the kernel spills registers"
    if sms:
        # persistent: the bias load and the store sit in the tile loop, after the k loop
        assert [ir.as_int(g) for g in k.grid] == [sms]
        tile_loop = default[default.index("scf.for"):]
        k_loop = tile_loop.index("scf.for", 1)
        assert k_loop < tile_loop.index("tt.load ") < tile_loop.index("ttng.async_tma_copy_local_to_global")
    else:
        assert "scf.for" not in default[default.index("ttng.async_tma_copy_local_to_global"):]


# ----------------------------------------------------------------------------------------------
# tilews.ops.matmul_bias_act on the CPU


@pytest.mark.parametrize("act", ["none", "relu", "gelu", "silu"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_matmul_bias_act_on_the_cpu(act, dtype):
    M, N, K = 70, 50, 40                     # partial tiles in every dimension
    a, b, bias = inputs(M, N, K, dtype, seed=3)
    alpha = -0.5 if act == "relu" else 1.25
    out = matmul_bias_act(a, b, bias, act, alpha=alpha)
    assert out.shape == (M, N) and out.dtype == dtype and not out.isnan().any()
    ref = reference(a, b, bias, act, alpha)
    assert rel_err(out, ref) < 1e-2
    if act != "none":
        assert rel_err(out, reference(a, b, bias, "none", alpha)) > 0.05


def test_matmul_bias_act_argument_errors():
    a, b, bias = inputs(32, 16, 24, torch.float16, seed=5)
    with pytest.raises(ValueError, match="activation must be one of none, relu, gelu, silu, got 'tanh'"):
        matmul_bias_act(a, b, bias, "tanh")
    with pytest.raises(ValueError, match=r"shapes a \(32, 24\), b \(16, 24\), bias \(16,\) do not chain"):
        matmul_bias_act(a, b.T.contiguous(), bias)
    with pytest.raises(TypeError, match="'bias' is torch.float32"):
        matmul_bias_act(a, b, bias.float())
    with pytest.raises(ValueError, match="'b' must be a 2-d tensor"):
        matmul_bias_act(a, b[0], bias)


# ----------------------------------------------------------------------------------------------
# TileLang's other epilogue styles: the bias tile copied into a fragment, C written element by
# element from T.Parallel


def epilogue_style_gemm(M, N, K, style, bm=128, bn=128, bk=64):
    """C = A @ B with an epilogue in one of TileLang's styles: ``bias_fragment`` (copy the bias
    tile into a fragment, add it), ``elementwise`` (store relu(C) element by element),
    ``shared_elements`` (element stores that several iterations share: refused by Gluon)."""
    dtype = T.float16

    @T.prim_func
    def main(A: T.Tensor((M, K), dtype), B: T.Tensor((K, N), dtype), Bias: T.Tensor((N,), dtype),
             C: T.Tensor((M, N), dtype)):
        with T.Kernel(T.ceildiv(N, bn), T.ceildiv(M, bm), threads=256) as (bx, by):
            A_s = T.alloc_shared((bm, bk), dtype)
            B_s = T.alloc_shared((bk, bn), dtype)
            C_f = T.alloc_fragment((bm, bn), T.float32)
            bias_f = T.alloc_fragment((bn,), dtype)
            T.clear(C_f)
            for k in T.Pipelined(T.ceildiv(K, bk), num_stages=2):
                T.copy(A[by * bm, k * bk], A_s)
                T.copy(B[k * bk, bx * bn], B_s)
                T.gemm(A_s, B_s, C_f)
            if style == "bias_fragment":
                T.copy(Bias[bx * bn], bias_f)
                for i, j in T.Parallel(bm, bn):
                    C_f[i, j] = C_f[i, j] + bias_f[j]
                T.copy(C_f, C[by * bm, bx * bn])
            else:
                for i, j in T.Parallel(bm, bn):
                    if style == "elementwise":
                        C[by * bm + i, bx * bn + j] = T.max(C_f[i, j], 0)
                    else:
                        C[by * bm + i, bx * bn] = C_f[i, j]
    return main


def style_args(M, N, K, seed):
    a, b = randn(M, K, dtype=torch.float16, seed=seed), randn(K, N, dtype=torch.float16, seed=seed + 1)
    return [a, b, randn(N, dtype=torch.float16, seed=seed + 2), torch.empty(M, N, dtype=torch.float16)]


def test_bias_copied_into_a_fragment_stays_on_the_gluon_path():
    M, N, K = 256, 200, 128                      # N = 200: the last bias tile is masked
    args = style_args(M, N, K, 21)
    a, b, bias = args[:3]
    after = assert_same_under_schedules(epilogue_style_gemm(M, N, K, "bias_fragment"), args, 3)
    assert after.find_plan(AsyncPlan) is not None
    want = (a.double() @ b.double()) + bias.double()
    assert rel_err(run_interp(after, args, 3, seed=3), want) < 1e-2
    p = gluon_program(after)
    ttgir = p.asm["ttgir"]
    default = ttgir[ttgir.index("ttg.warp_specialize("):ttgir.index("partition0(")]
    # one masked load of the 128-wide bias tile, laid out as a column slice of the accumulator
    loads = re.findall(r"tt\.load %\S+, %\S+, %\S+ : tensor<128x!tt\.ptr<f16>, #ttg\.slice<\{dim = 0, "
                       r"parent = (#mma\d*)\}>>", default)
    assert len(loads) == 1
    assert count(r"\b(ld|st)\.local\b", p.asm["ptx"]) == 0


def test_elementwise_epilogue_stores_stay_on_the_gluon_path():
    M, N, K = 200, 136, 128                      # ragged rows and columns: masked stores
    args = style_args(M, N, K, 31)
    after = assert_same_under_schedules(epilogue_style_gemm(M, N, K, "elementwise"), args, 3)
    assert after.find_plan(AsyncPlan) is not None
    ttgir = gluon_program(after).asm["ttgir"]
    default = ttgir[ttgir.index("ttg.warp_specialize("):ttgir.index("partition0(")]
    assert count(r"tt\.store %\S+, %\S+, %\S+ : tensor<128x128x!tt\.ptr<f16>, #mma\d*>", default) == 1


def test_epilogue_stores_sharing_elements_are_refused_with_the_reason():
    """Every j writes C[.., bx * bn]: a race between T.Parallel's iterations, refused when the
    program is built (before any backend: every target gives the same answer)."""
    with pytest.raises(CompileError, match="race in T.Parallel: this store into 'C' does not use "
                                           "loop variable 'j'"):
        build_kernel(epilogue_style_gemm(256, 256, 128, "shared_elements"))
