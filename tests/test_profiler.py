"""The profiler surface (``tilews.profiler``) and the kernel object's TileLang tools.

* ``TensorSupplyType``: each type's values, dtypes, shapes (drawn large enough that a wrong range
  or distribution shows).
* ``Profiler.assert_allclose``: passes for a correct reference, fails for a wrong one, for a
  dtype / shape / count mismatch, and honours ``max_mismatched_ratio``.
* ``do_bench`` on the CPU: a positive time, the call counts it promises, quantiles, and
  ``ValueError`` naming a bad ``backend`` / ``return_mode``.
* ``Kernel``: ``params``, ``out_idx``, several outputs as a list in ``out_idx`` order, the
  autotuner's attributes, runtime dims and scalars in ``supply``.
Kernels are the README's factory-style GEMM on targets ``interpret`` and ``triton`` (Triton's CPU
interpreter without a GPU).
"""
from __future__ import annotations

import pytest
import torch

import tilews
import tilews.language as T
from tilews.profiler import Profiler, TensorSupplyType, do_bench


def matmul(M, N, K, block_M=32, block_N=32, block_K=32, dtype=T.float16):
    @T.prim_func
    def main(A: T.Tensor((M, K), dtype), B: T.Tensor((K, N), dtype), C: T.Tensor((M, N), dtype)):
        with T.Kernel(T.ceildiv(N, block_N), T.ceildiv(M, block_M), threads=128) as (bx, by):
            A_s = T.alloc_shared((block_M, block_K), dtype)
            B_s = T.alloc_shared((block_K, block_N), dtype)
            C_f = T.alloc_fragment((block_M, block_N), T.float32)
            T.clear(C_f)
            for k in T.Pipelined(T.ceildiv(K, block_K), num_stages=2):
                T.copy(A[by * block_M, k * block_K], A_s)
                T.copy(B[k * block_K, bx * block_N], B_s)
                T.gemm(A_s, B_s, C_f)
            T.copy(C_f, C[by * block_M, bx * block_N])
    return main


def sum_diff(n, block=32):
    """Three parameters X, Y, S, D: S = X + Y and D = X - Y (two outputs)."""
    @T.prim_func
    def main(X: T.Tensor((n,), T.float32), S: T.Tensor((n,), T.float32),
             Y: T.Tensor((n,), T.float32), D: T.Tensor((n,), T.float32)):
        with T.Kernel(T.ceildiv(n, block), threads=32) as bx:
            for i in T.Parallel(block):
                S[bx * block + i] = X[bx * block + i] + Y[bx * block + i]
                D[bx * block + i] = X[bx * block + i] - Y[bx * block + i]
    return main


def scaled(block=32):
    """A runtime dim m and a runtime scalar alpha: Y = alpha * X."""
    @T.prim_func
    def main(X: T.Tensor((T.dynamic("m"),), T.float32), Y: T.Tensor((T.dynamic("m"),), T.float32),
             alpha: T.float32):
        with T.Kernel(T.ceildiv(X.shape[0], block), threads=32) as bx:
            for i in T.Parallel(block):
                if bx * block + i < X.shape[0]:
                    Y[bx * block + i] = X[bx * block + i] * alpha
    return main


def _ref_matmul(a, b):
    return (a.double() @ b.double()).to(a.dtype)


@pytest.fixture(scope="module", params=["interpret", "triton"])
def gemm(request):
    return tilews.jit(out_idx=[-1], target=request.param)(matmul)(64, 96, 64)


# ----------------------------------------------------------------------------------------------
# supply types

DTYPES = [T.float16, T.bfloat16, T.float32, T.float64, T.int8, T.int32, T.uint8, T.boolean,
          T.float8_e4m3fn, T.float8_e5m2]


def _supplied(supply_type, dtype, n=4096):
    k = tilews.jit(out_idx=[-1], target="interpret")(_copy_kernel)(n, dtype)
    (x,) = k.get_profiler(supply_type).supply()
    assert x.dtype == dtype.torch_dtype and x.shape == (n,) and x.device.type == "cpu"
    return x.to(torch.float64)


def _copy_kernel(n, dtype):
    @T.prim_func
    def main(X: T.Tensor((n,), dtype), Y: T.Tensor((n,), dtype)):
        with T.Kernel(1, threads=32):
            for i in T.Parallel(n):
                Y[i] = X[i]
    return main


def _is_integral(x):
    return bool((x == x.round()).all())


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_auto_values(dtype):
    x = _supplied(TensorSupplyType.Auto, dtype)
    kind = dtype.record.kind
    if dtype in (T.float16, T.bfloat16, T.float32):
        assert x.min() >= -1 and x.max() <= 1 and not _is_integral(x) and x.unique().numel() > 100
    elif dtype.is_float and dtype.bits == 8:   # int8 values converted to the fp8 grid
        assert not torch.isnan(x).any() and _is_integral(x) and x.min() >= -128 and x.max() <= 128
        assert x.unique().numel() > 20
    elif kind in ("uint", "bool"):
        assert set(x.unique().tolist()) == ({0, 1, 2} if kind == "uint" else {0, 1})
    else:                                      # signed ints and fp64
        assert set(x.unique().tolist()) == {-2, -1, 0, 1, 2}


def test_integer_values_even_for_floats():
    assert set(_supplied(TensorSupplyType.Integer, T.float32).unique().tolist()) == {-2, -1, 0, 1, 2}
    assert set(_supplied(TensorSupplyType.Integer, T.uint8).unique().tolist()) == {0, 1, 2}


@pytest.mark.parametrize("supply_type, mean", [(TensorSupplyType.Uniform, 0.0),
                                               (TensorSupplyType.Normal, -1.0),
                                               (TensorSupplyType.Randn, 0.0)])
def test_float_draws(supply_type, mean):
    x = _supplied(supply_type, T.float32, n=1 << 16)
    assert abs(x.mean().item() - mean) < 0.02
    if supply_type is TensorSupplyType.Uniform:
        assert x.min() >= -1 and x.max() <= 1 and abs(x.std().item() - 3 ** -0.5) < 0.02
    else:
        assert abs(x.std().item() - 1.0) < 0.02
    # int8 parameters are ones under Uniform and Normal (TileLang's rule)
    if supply_type is not TensorSupplyType.Randn:
        assert (_supplied(supply_type, T.int8) == 1).all()


@pytest.mark.parametrize("supply_type, value", [(TensorSupplyType.Zero, 0), (TensorSupplyType.One, 1)])
def test_constant_supplies(supply_type, value):
    assert (_supplied(supply_type, T.bfloat16) == value).all()


def test_supply_type_is_checked():
    k = tilews.jit(out_idx=[-1], target="interpret")(_copy_kernel)(8, T.float32)
    assert k.get_profiler(5).supply_type is TensorSupplyType.Zero
    with pytest.raises(ValueError, match="tensor_supply_type"):
        k.get_profiler(9)


def test_each_supply_is_fresh(gemm):
    p = gemm.get_profiler()
    (a1, b1), (a2, _) = p.supply(), p.supply()
    assert a1.shape == (64, 64) and b1.shape == (64, 96) and a1.dtype == torch.float16
    assert not torch.equal(a1, a2)


# ----------------------------------------------------------------------------------------------
# assert_allclose


def test_assert_allclose_accepts_a_correct_reference(gemm):
    p = gemm.get_profiler(TensorSupplyType.Auto)
    assert p.func is gemm
    p.assert_allclose(_ref_matmul)
    p.assert_allclose(_ref_matmul, input_tensors=p.supply(), atol=1e-2, rtol=1e-2)


def test_assert_allclose_rejects_a_wrong_reference(gemm):
    p = gemm.get_profiler()
    with pytest.raises(AssertionError, match=r"output 0: \d+ of 6144 elements .* Worst at index"):
        p.assert_allclose(lambda a, b: _ref_matmul(a, b) + 0.5)


def test_assert_allclose_checks_dtype_shape_and_count(gemm):
    p = gemm.get_profiler()
    with pytest.raises(AssertionError, match="dtype torch.float16 from the kernel, torch.float32"):
        p.assert_allclose(lambda a, b: a.float() @ b.float())
    with pytest.raises(AssertionError, match=r"shape \(64, 96\) from the kernel, \(64, 95\)"):
        p.assert_allclose(lambda a, b: _ref_matmul(a, b)[:, :95])
    with pytest.raises(AssertionError, match="the kernel returned 1 output"):
        p.assert_allclose(lambda a, b: (_ref_matmul(a, b), a))


def test_max_mismatched_ratio():
    k = tilews.jit(out_idx=[-1], target="interpret")(_copy_kernel)(1000, T.float32)
    p = k.get_profiler()

    def off_in(count):
        def ref(x):
            y = x.clone()
            y[:count] += 1
            return y
        return ref
    p.assert_allclose(off_in(10), max_mismatched_ratio=0.01)      # 10 of 1000 may differ
    with pytest.raises(AssertionError, match=r"11 of 1000 elements \(1.10%\)"):
        p.assert_allclose(off_in(11), max_mismatched_ratio=0.01)


# ----------------------------------------------------------------------------------------------
# do_bench


def test_do_bench_on_the_cpu_counts_calls():
    calls = []
    ms = do_bench(lambda: calls.append(1), _n_warmup=3, _n_repeat=7, device="cpu")
    assert isinstance(ms, float) and ms > 0
    assert len(calls) == 1 + 5 + 3 + 7           # first call, estimate, warm-up, timed
    calls.clear()
    q = do_bench(lambda: calls.append(1), _n_warmup=1, _n_repeat=4, quantiles=[0.2, 0.5, 0.8],
                 device="cpu")
    assert isinstance(q, list) and len(q) == 3 and q[0] <= q[1] <= q[2]


def test_do_bench_budgets_are_milliseconds():
    import time
    calls = []

    def sleepy():
        calls.append(1)
        time.sleep(0.002)
    ms = do_bench(sleepy, warmup=10, rep=20, device="cpu", return_mode="median")
    assert 1.5 < ms < 50
    # about 10 ms of warm-up and 20 ms of timed calls at ~2 ms each (never fewer than one)
    assert 1 + 5 + 2 <= len(calls) <= 1 + 5 + 5 + 10


@pytest.mark.parametrize("kwargs, name", [({"backend": "nvtx"}, "backend"),
                                          ({"return_mode": "p99"}, "return_mode")])
def test_do_bench_rejects_unknown_choices(kwargs, name):
    with pytest.raises(ValueError, match=rf"do_bench\({name}=\.\.\.\)"):
        do_bench(lambda: None, **kwargs)


def test_profiler_do_bench(gemm):
    p = gemm.get_profiler()
    calls = []

    def ref(a, b):
        calls.append(1)
        return a @ b
    assert p.do_bench(n_warmup=1, n_repeat=2) > 0
    assert p.do_bench(ref, n_warmup=2, n_repeat=3) > 0 and len(calls) == 1 + 5 + 2 + 3
    assert p.do_bench(input_tensors=p.supply(), n_warmup=1, n_repeat=1, return_mode="min") > 0


# ----------------------------------------------------------------------------------------------
# the kernel object


def test_kernel_params_and_outputs_as_a_list():
    k = tilews.jit(out_idx=[-1, 1], target="interpret")(sum_diff)(96)
    assert [(p.name, p.is_output) for p in k.params] == [("X", False), ("S", True), ("Y", False),
                                                           ("D", True)]
    assert k.params[0].shape == (96,) and k.params[0].dtype == "float32"
    assert k.out_idx == [3, 1]
    x, y = torch.randn(96), torch.randn(96)
    out = k(x, y)
    assert isinstance(out, list) and len(out) == 2
    d, s = out                                   # out_idx order: D, then S
    torch.testing.assert_close(d, x - y)
    torch.testing.assert_close(s, x + y)
    k.get_profiler().assert_allclose(lambda a, b: [a - b, a + b], atol=0, rtol=0)


def test_autotuner_attributes_and_source():
    k = tilews.jit(out_idx=[-1], target="triton")(matmul)(32, 32, 32)
    assert (k.latency, k.config, k.ref_latency) == (None, None, None)
    k.latency, k.config, k.ref_latency = 0.5, {"block_M": 32}, 0.7
    assert (k.latency, k.config, k.ref_latency) == (0.5, {"block_M": 32}, 0.7)
    assert "tl.dot" in k.get_kernel_source(kernel_only=True) == k.get_kernel_source(kernel_only=False)


def test_runtime_dims_and_scalars_need_values():
    k = tilews.jit(out_idx=[1], target="interpret")(scaled)()
    assert k.params[0].shape == ("m",) and k.params[2].is_scalar()
    p = k.get_profiler()
    with pytest.raises(ValueError, match="runtime scalar parameter.* alpha"):
        p.supply()
    with pytest.raises(ValueError, match=r"runtime \(T.dynamic\) dimension\(s\) m"):
        p.supply({"alpha": 2.0})
    x, alpha = p.supply({"m": 40, "alpha": 2.0})
    assert x.shape == (40,) and alpha == 2.0
    assert p.do_bench(n_warmup=1, n_repeat=1, dynamic_symbolic_constraints={"m": 40, "alpha": 2.0}) > 0
    p.assert_allclose(lambda x, a: x * a, input_tensors=[x, alpha], atol=0, rtol=0)


def test_profiler_of_a_kernel_object():
    k = tilews.jit(out_idx=[-1], target="interpret")(_copy_kernel)(8, T.float32)
    assert isinstance(k.get_profiler(), Profiler) and k.get_profiler().supply_type is TensorSupplyType.Auto
