"""The eager style of ``@tilews.jit`` (TileLang's newer one): tensors declared in the body,
``T.const`` specialization, ``T.dynamic`` dims, ``T.empty`` outputs, ``fn.compile``."""
from __future__ import annotations

import importlib

import pytest
import torch

import tilews
import tilews.language as T
from tilews.errors import CompileError

from .helpers import randn as rand

jit_module = importlib.import_module("tilews.jit")  # the module; tilews.jit is the decorator


@tilews.jit
def matmul_relu(A, B, block_M, block_N, block_K, dtype=T.float16, accum_dtype=T.float32):
    M, N, K = T.const("M, N, K")
    A: T.Tensor((M, K), dtype)
    B: T.Tensor((K, N), dtype)
    C = T.empty((M, N), dtype)
    with T.Kernel(T.ceildiv(N, block_N), T.ceildiv(M, block_M), threads=128) as (bx, by):
        A_s = T.alloc_shared((block_M, block_K), dtype)
        B_s = T.alloc_shared((block_K, block_N), dtype)
        C_f = T.alloc_fragment((block_M, block_N), accum_dtype)
        T.clear(C_f)
        for k in T.Pipelined(T.ceildiv(K, block_K), num_stages=2):
            T.copy(A[by * block_M, k * block_K], A_s)
            T.copy(B[k * block_K, bx * block_N], B_s)
            T.gemm(A_s, B_s, C_f)
        for i, j in T.Parallel(block_M, block_N):
            C_f[i, j] = T.max(C_f[i, j], 0)
        T.copy(C_f, C[by * block_M, bx * block_N])
    return C


def _matmul_ref(a, b):
    return torch.relu(a.double() @ b.double())


def test_call_specializes_on_const_dims_and_runs():
    a, b = rand(48, 40, dtype=torch.float16), rand(40, 72, dtype=torch.float16)
    c = matmul_relu(a, b, 32, 32, 16)
    assert c.shape == (48, 72) and c.dtype == torch.float16
    torch.testing.assert_close(c.double(), _matmul_ref(a, b), rtol=1e-2, atol=1e-2)
    # the same T.const values and build parameters reuse the kernel; a new M compiles another
    k = matmul_relu.compile(a, b, 32, 32, 16)
    assert k is matmul_relu.compile(M=48, N=72, K=40, block_M=32, block_N=32, block_K=16)
    a2 = rand(80, 40, dtype=torch.float16)
    assert matmul_relu.compile(a2, b, 32, 32, 16) is not k
    torch.testing.assert_close(matmul_relu(a2, b, block_M=32, block_N=32, block_K=16).double(),
                               _matmul_ref(a2, b), rtol=1e-2, atol=1e-2)


def test_compiled_kernel_takes_the_inputs_only():
    k = matmul_relu.compile(M=32, N=32, K=32, block_M=32, block_N=32, block_K=32)
    assert k.binder.input_names == ["A", "B"]
    a, b = rand(32, 32, dtype=torch.float16), rand(32, 32, dtype=torch.float16)
    torch.testing.assert_close(k(a, b).double(), _matmul_ref(a, b), rtol=1e-2, atol=1e-2)
    assert matmul_relu.mode == "eager"
    assert matmul_relu.kernel_inputs(a, b, 32, 32, 32) == [a, b]
    assert "A" in matmul_relu.get_kernel_source(a, b, 32, 32, 32) or k.get_kernel_source()


def test_cpu_tensors_choose_the_interpreter():
    a, b = rand(32, 32, dtype=torch.float16), rand(32, 32, dtype=torch.float16)
    assert matmul_relu.compile(a, b, 32, 32, 32).target == "interpret"


@tilews.jit
def row_stats(X, s, scale, block_M=16):
    M = T.dynamic("M")
    N = T.const("N")
    X: T.Tensor((M, N), T.float32)
    s: T.float32
    Total = T.empty((M,), T.float32)
    Peak = T.empty((M,), T.float32)
    with T.Kernel(T.ceildiv(M, block_M), threads=128) as bx:
        x = T.alloc_fragment((block_M, N), T.float32)
        t = T.alloc_fragment((block_M,), T.float32)
        p = T.alloc_fragment((block_M,), T.float32)
        T.copy(X[bx * block_M, 0], x)
        T.reduce_sum(x, t, dim=1)
        T.reduce_max(x, p, dim=1)
        for i in T.Parallel(block_M):
            t[i] = t[i] * scale * s
        T.copy(t, Total[bx * block_M])
        T.copy(p, Peak[bx * block_M])
    return Peak, Total


def test_several_outputs_in_return_order_dynamic_dims_and_runtime_scalars():
    kernels = set()
    for m in (20, 37):
        x = rand(m, 32)
        out = row_stats(x, 2.0, 3.0)
        assert isinstance(out, list) and len(out) == 2
        peak, total = out
        torch.testing.assert_close(peak, x.amax(dim=1))
        torch.testing.assert_close(total.double(), x.double().sum(dim=1) * 6.0, rtol=1e-5, atol=1e-5)
        kernels.add(row_stats.compile(x, 2.0, 3.0))
    assert len(kernels) == 1, "a T.dynamic dim must not recompile"
    assert row_stats.compile(x, 2.0, 3.0) is row_stats.compile(x, 5.0, 3.0)
    assert row_stats.compile(x, 2.0, 3.0) is not row_stats.compile(x, 2.0, 4.0), \
        "a build-time parameter is part of the key"


@tilews.jit
def scale_in_place(X, factor):
    N = T.const("N")
    X: T.Tensor((N,), T.float32)
    with T.Kernel(1, threads=128) as _:
        f = T.alloc_fragment((N,), T.float32)
        T.copy(X[0], f)
        for i in T.Parallel(N):
            f[i] = f[i] * factor
        T.copy(f, X[0])


def test_no_outputs_writes_the_given_tensors_and_returns_an_empty_list():
    x = rand(64)
    expected = x * 3
    assert scale_in_place(x, 3.0) == []
    torch.testing.assert_close(x, expected)


@tilews.jit
def add_rows(X, block=16):
    X: T.Tensor([ROWS, COLS], T.float32)          # module globals, defined after the function
    Y = T.empty([ROWS, COLS], T.float32)
    with T.Kernel(T.ceildiv(ROWS, block), threads=128) as bx:
        x = T.alloc_fragment((block, COLS), T.float32)
        T.copy(X[bx * block, 0], x)
        for i, j in T.Parallel(block, COLS):
            x[i, j] = x[i, j] + 1
        T.copy(x, Y[bx * block, 0])
    return Y


ROWS, COLS = 40, 24


def test_module_globals_are_read_at_the_first_compile():
    x = rand(ROWS, COLS)
    torch.testing.assert_close(add_rows(x), x + 1)


def test_unknown_keyword_is_an_error_naming_it():
    a, b = rand(32, 32, dtype=torch.float16), rand(32, 32, dtype=torch.float16)
    with pytest.raises(TypeError, match="blockM"):
        matmul_relu(a, b, 32, 32, 32, blockM=64)


def test_const_without_a_value_is_an_error():
    with pytest.raises(ValueError, match="T.const 'M'.*pass 'A' or give M="):
        matmul_relu.compile(N=32, K=32, block_M=32, block_N=32, block_K=32)


def test_missing_tensor_argument_in_a_call_is_an_error():
    a = rand(32, 32, dtype=torch.float16)
    with pytest.raises(TypeError, match="missing"):
        matmul_relu(a, block_M=32, block_N=32, block_K=32, N=32)


def test_wrong_dtype_fails_the_argument_check_naming_the_parameter():
    a, b = rand(32, 32), rand(32, 32)          # float32, the kernel is built for float16
    with pytest.raises((TypeError, ValueError), match="'A'"):
        matmul_relu(a, b, 32, 32, 32)


def test_out_idx_is_refused_for_eager_functions():
    with pytest.raises(ValueError, match="T.empty"):
        @tilews.jit(out_idx=[-1])
        def f(X):
            N = T.const("N")
            X: T.Tensor((N,), T.float32)
            Y = T.empty((N,), T.float32)
            with T.Kernel(1) as _:
                T.copy(X[0], Y[0])
            return Y


@tilews.jit
def forgets_output(X):
    N = T.const("N")
    X: T.Tensor((N,), T.float32)
    Y = T.empty((N,), T.float32)
    Z = T.empty((N,), T.float32)
    with T.Kernel(1) as _:
        T.copy(X, Y)
        T.copy(X, Z)
    return Y


@tilews.jit
def returns_an_input(X):
    N = T.const("N")
    X: T.Tensor((N,), T.float32)
    with T.Kernel(1) as _:
        f = T.alloc_fragment((N,), T.float32)
        T.fill(f, 1.0)
        T.copy(f, X[0])
    return X


@tilews.jit
def uses_before_declaring(X):
    N = T.const("N")
    n = X.shape[0]
    X: T.Tensor((N,), T.float32)
    with T.Kernel(1) as _:
        f = T.alloc_fragment((n,), T.float32)
        T.fill(f, 1.0)
        T.copy(f, X[0])


@pytest.mark.parametrize("fn, message", [
    (forgets_output, "must return every T.empty output; Z is not returned"),
    (returns_an_input, "returns its T.empty outputs only"),
    (uses_before_declaring, "parameter 'X' is used before its declaration"),
])
def test_body_mistakes_are_compile_errors_at_the_users_line(fn, message):
    with pytest.raises(CompileError, match=message) as e:
        fn(rand(16))
    assert e.value.loc.file.endswith("test_eager.py") and e.value.loc.line > 0


def test_const_outside_an_eager_function_is_an_error():
    with pytest.raises(CompileError, match="only inside an eager"):
        T.const("M")


def test_par_compile_returns_kernels_in_order():
    configs = [dict(M=32, N=32, K=32, block_M=bm, block_N=32, block_K=32) for bm in (16, 32)]
    ks = matmul_relu.par_compile(configs)
    assert [k.ir_after is not None for k in ks] == [True, True]
    assert ks[1] is matmul_relu.compile(**configs[1])


@pytest.mark.parametrize("version,safe", [((3, 10, 14), False), ((3, 11, 7), False),
                                          ((3, 11, 8), True), ((3, 12, 1), False),
                                          ((3, 12, 2), True), ((3, 13, 0), True)])
def test_ast_is_thread_safe_from_the_cpython_fix(version, safe):
    assert jit_module.ast_is_thread_safe(version) is safe


def test_compile_each_stays_on_the_calling_thread_where_ast_is_not_thread_safe(monkeypatch):
    import threading
    monkeypatch.setattr(jit_module, "ast_is_thread_safe", lambda: False)
    threads = jit_module.compile_each(range(4), lambda i: (i, threading.get_ident()))
    assert threads == [(i, threading.get_ident()) for i in range(4)]
