"""No raw errors (issue 42, item 5): each case a user reached with a raw Python or Triton error
now works or raises a clear error naming the argument or pointing at the user's line."""
from __future__ import annotations

import functools

import pytest
import torch

import tilews
import tilews.language as T
from tilews.ops.attention import attention
from tilews.ops.epilogue import matmul_bias_act
from tilews.ops.fp8 import fp8_scaled_mm
from tilews.metal import harness

from .helpers import marked_line, poisoned, randn


def scaled_copy(N, block, scale):
    @T.prim_func
    def main(A: T.Tensor((N,), T.float32), B: T.Tensor((N,), T.float32)):
        with T.Kernel(T.ceildiv(N, block), threads=128) as bx:
            for i in T.Parallel(block):
                B[bx * block + i] = A[bx * block + i] * scale
    return main


def test_a_partial_factory_is_named_after_its_function_and_keys_on_its_bound_arguments():
    factory = tilews.jit(out_idx=-1, target="interpret")(functools.partial(scaled_copy, scale=2.0))
    assert factory.__name__ == "scaled_copy"
    a = randn(64, seed=1)
    assert torch.equal(factory(64, 32)(a), a * 2)
    assert torch.equal(factory(64, 32, scale=3.0)(a), a * 3)      # the bound keyword overridden
    halve = tilews.jit(out_idx=-1, target="interpret")(functools.partial(scaled_copy, 64, 32))
    assert torch.equal(halve(0.5)(a), a * 0.5)


def test_an_unusable_dump_ir_folder_names_the_variable_and_path(tmp_path, monkeypatch):
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    monkeypatch.setenv("TILEWS_DUMP_IR", str(blocker / "ir"))
    monkeypatch.setenv("TILEWS_DISABLE_CACHE", "1")
    with pytest.raises(ValueError, match=rf"TILEWS_DUMP_IR='{blocker / 'ir'}': cannot write the IR "
                                         rf"dump there \(Not a directory\)"):
        tilews.jit(out_idx=-1, target="interpret")(scaled_copy)(64, 32, 2.0)
    monkeypatch.setenv("TILEWS_DUMP_IR", str(tmp_path / "new" / "ir"))     # created if missing
    tilews.jit(out_idx=-1, target="interpret")(scaled_copy)(64, 32, 2.0)
    assert any(p.name.endswith(".frontend.tir") for p in (tmp_path / "new" / "ir").iterdir())


def test_an_unknown_dtype_in_an_annotation_points_at_the_users_line():
    # evaluated by Python when the factory runs (this module's annotations are strings, which
    # tilews evaluates while building; that case had the line already)
    def f(N):
        spec = T.Tensor((N,), "float33")  # <- error

        @T.prim_func
        def main(A: spec, B: T.Tensor((N,), T.float32)):
            with T.Kernel(1, threads=128) as bx:
                for i in T.Parallel(N):
                    B[i] = A[i]
        return main
    with pytest.raises(tilews.CompileError) as info:
        tilews.jit(out_idx=-1, target="interpret")(f)(16)
    e = info.value
    assert e.loc.line == marked_line(f) and e.loc.file == __file__, str(e)
    assert "unknown dtype 'float33'" in e.message and "float16" in e.message and "int32" in e.message


@pytest.mark.parametrize("dim", [0, 1, 8, 12, 20, 264])
def test_attention_names_the_head_dims_it_takes(dim):
    q = randn(1, 2, 16, dim, dtype=torch.float16, seed=2)
    with pytest.raises(ValueError, match=rf"attention\(\): the head dim \(the last dim of 'q', 'k' and "
                                         rf"'v'\) is {dim}; attention takes head dims that are "
                                         rf"multiples of 8 from 16 to 256"):
        attention(q, q, q)


def test_attention_at_the_smallest_head_dims():
    for dim in (16, 24):
        q, k, v = (randn(1, 2, 40, dim, dtype=torch.float16, seed=3 + s) for s in range(3))
        ref = torch.nn.functional.scaled_dot_product_attention(q.double(), k.double(), v.double(),
                                                               is_causal=True)
        assert (attention(q, k, v, is_causal=True).double() - ref).abs().max() < 2e-3


@pytest.mark.parametrize("activation", ["none", "relu", "gelu", "silu"])
def test_matmul_bias_act_with_a_zero_size_dim(activation):
    bias = randn(24, dtype=torch.float16, seed=4)
    assert matmul_bias_act(randn(0, 8, dtype=torch.float16), randn(8, 24, dtype=torch.float16),
                           bias, activation).shape == (0, 24)
    assert matmul_bias_act(randn(5, 8, dtype=torch.float16), randn(8, 0, dtype=torch.float16),
                           bias[:0], activation).shape == (5, 0)
    out = matmul_bias_act(randn(5, 0, dtype=torch.float16), randn(0, 24, dtype=torch.float16), bias,
                          activation, alpha=3.0)
    act = {"none": lambda x: x, "relu": torch.relu, "silu": torch.nn.functional.silu,
           "gelu": lambda x: torch.nn.functional.gelu(x, approximate="tanh")}[activation]
    assert out.dtype == torch.float16 and torch.equal(out, act(bias.double()).half().expand(5, 24))


def test_matmul_bias_act_refuses_inputs_that_require_grad():
    a, b, bias = randn(16, 8, dtype=torch.float16), randn(8, 16, dtype=torch.float16), randn(16, dtype=torch.float16)
    for grads in ((a,), (b,), (bias,)):
        for t in grads:
            t.requires_grad_(True)
        with pytest.raises(NotImplementedError, match=r"matmul_bias_act\(\): autograd is not supported yet"):
            matmul_bias_act(a, b, bias)
        with torch.no_grad():                   # no grad mode: runs
            assert matmul_bias_act(a, b, bias).shape == (16, 16)
        for t in grads:
            t.requires_grad_(False)


def test_fp8_scaled_mm_errors_name_its_own_parameters():
    a = randn(32, 64).to(torch.float8_e4m3fn)
    b = randn(64, 48).to(torch.float8_e4m3fn)
    sa, sb = torch.rand(32, 1) + 0.5, torch.rand(1, 48) + 0.5
    with pytest.raises(ValueError, match="parameter 'scale_a' is on device meta"):
        fp8_scaled_mm(a, b, sa.to("meta"), sb)
    with pytest.raises(ValueError, match="parameter 'scale_b' is on device meta"):
        fp8_scaled_mm(a, b, sa, sb.to("meta"))


def squared_offset(n):
    @T.prim_func
    def main(A: T.Tensor((64,), T.float32), B: T.Tensor((64,), T.float32)):
        with T.Kernel(1, threads=128) as bx:
            for i in T.Parallel(64):
                B[i] = A[(i + n * n) % 61]
    return main


def squared_runtime_offset(N):
    @T.prim_func
    def main(A: T.Tensor((64,), T.float32), B: T.Tensor((64,), T.float32), n: T.int32):
        with T.Kernel(1, threads=128) as bx:
            for i in T.Parallel(64):
                B[i] = A[(i + n * n) % 61]
    return main


def scalar_int32_math():
    @T.prim_func
    def main(Y: T.Tensor((6, 4), T.int32), n: T.int32):
        with T.Kernel(1, threads=32) as bx:
            for i in T.Parallel(4):
                Y[0, i] = (n * n) % 61
                Y[1, i] = (n * n * 3) // 7
                Y[2, i] = -(n * n) % 1000
                Y[3, i] = (n << 16) % 97
            for k in T.serial(2):
                for i in T.Parallel(4):
                    Y[4 + k, i] = ((k + 1) * n * n) % 61
    return main


def wrap32(v: int) -> int:
    return (v + 2**31) % 2**32 - 2**31


@pytest.mark.parametrize("target", ["interpret", "triton"])
def test_a_build_time_integer_beyond_int32_is_exact_int64(target):
    # 50000 * 50000 is Python's product: a literal beyond int32 is int64, as in TileLang
    a = randn(64, seed=5)
    out = tilews.jit(out_idx=1, target=target)(squared_offset)(50000)(a)
    assert torch.equal(out, a[(torch.arange(64) + 50000 * 50000) % 61])


INT_TARGETS = ["interpret", "triton",
               pytest.param("metal", marks=pytest.mark.skipif(harness.compiler() is None,
                                                              reason="needs a C++17 compiler"))]


@pytest.mark.parametrize("target", INT_TARGETS)
def test_runtime_int32_arithmetic_wraps_on_every_target(target):
    """Scalar parameters are runtime int32 values: their arithmetic wraps on every target. Before,
    the triton target on a CPU (whose scalar parameters are Python ints) gave the exact product's
    (n * n) % 61 (34, not 38) and raised for an index reaching a tensor."""
    n, a, out = 50000, randn(64, seed=6), poisoned(64)
    tilews.jit(target=target)(squared_runtime_offset)(1)(a, out, n)
    assert torch.equal(out, a[(torch.arange(64) + wrap32(n * n)) % 61])
    y = poisoned(6, 4, dtype=torch.int32)
    tilews.jit(target=target)(scalar_int32_math)()(y, n)
    square = wrap32(n * n)
    want = [square % 61, wrap32(square * 3) // 7, wrap32(-square) % 1000, wrap32(n << 16) % 97,
            square % 61, wrap32(2 * square) % 61]
    assert y.tolist() == [[v] * 4 for v in want] and want[0] == 38


def test_the_interpreter_refuses_shared_memory_no_gpu_has():
    """A 4 MB shared buffer: no target could run it, so the interpreter (the oracle) refuses it
    too, at the kernel, naming the buffer (it accepted it before)."""
    from tilews.lowering.errors import ResourceLimitError

    @T.prim_func
    def main(X: T.Tensor((1024, 1024), T.float32), Y: T.Tensor((1024, 1024), T.float32)):
        with T.Kernel(1, threads=128) as bx:
            S = T.alloc_shared((1024, 1024), T.float32)
            T.copy(X, S)
            T.copy(S, Y)
    with pytest.raises(ResourceLimitError, match=r"needs 4194304 bytes of shared memory, more than "
                                                 r"the 232448 target 'interpret' has"):
        tilews.compile(main, target="interpret")
