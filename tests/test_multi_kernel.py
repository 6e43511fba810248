"""Several ``with T.Kernel`` blocks in one function (TileLang's split-KV decoding): each block is its
own kernel, launched in order on the caller's stream; the function's parameters and its
``T.alloc_global`` workspaces are visible to every kernel, and the runtime keeps the workspaces for
the next call of the same shapes on the same stream.

Programs are written as TileLang users write them (factory ``@T.prim_func`` and the eager style)
and run on ``interpret``, ``triton`` (Triton's CPU interpreter) and ``metal`` (its CPU harness)
against a float64 torch reference, random inputs, outputs poisoned by the test settings; Hopper is
compile-only."""
from __future__ import annotations

import pytest
import torch

import tilews
import tilews.binding
import tilews.language as T
from tilews.lowering import ir

from .helpers import marked_line, randn
from .test_language_compat import build
from .tilelang_compat.targets import CPU_TARGETS


def split_sum_softmax(B, S, N, bn, splits):
    """A split-KV-style decode reduction: the first kernel reduces each of ``splits`` slices of a
    row to a partial (its max and the sum of exp(x - max)) in two workspaces; the second combines
    the partials into the row's log-sum-exp."""
    per = N // splits

    @T.prim_func
    def lse(X: T.Tensor((B, N), T.float32), Out: T.Tensor((B,), T.float32)):
        part_max = T.alloc_global((B, splits), T.float32)
        part_sum = T.alloc_global((B, splits), T.float32)
        with T.Kernel(B // bn, splits, threads=128) as (bx, sid):
            x = T.alloc_fragment((bn, per), T.float32)
            m = T.alloc_fragment((bn,), T.float32)
            s = T.alloc_fragment((bn,), T.float32)
            T.copy(X[bx * bn, sid * per], x)
            T.reduce_max(x, m, dim=1)
            for i, j in T.Parallel(bn, per):
                x[i, j] = T.exp(x[i, j] - m[i])
            T.reduce_sum(x, s, dim=1)
            for i in T.Parallel(bn):
                part_max[bx * bn + i, sid] = m[i]
                part_sum[bx * bn + i, sid] = s[i]
        with T.Kernel(B // bn, threads=128) as bx:
            pm = T.alloc_fragment((bn, splits), T.float32)
            ps = T.alloc_fragment((bn, splits), T.float32)
            top = T.alloc_fragment((bn,), T.float32)
            total = T.alloc_fragment((bn,), T.float32)
            T.copy(part_max[bx * bn, 0], pm)
            T.copy(part_sum[bx * bn, 0], ps)
            T.reduce_max(pm, top, dim=1)
            for i, j in T.Parallel(bn, splits):
                ps[i, j] = ps[i, j] * T.exp(pm[i, j] - top[i])
            T.reduce_sum(ps, total, dim=1)
            for i in T.Parallel(bn):
                Out[bx * bn + i] = T.log(total[i]) + top[i]
    return lse


def lse_ref(x: torch.Tensor) -> torch.Tensor:
    return torch.logsumexp(x.double(), dim=1)


@pytest.mark.parametrize("target", CPU_TARGETS)
def test_split_then_combine(target):
    B, S, N = 32, 4, 64
    k = build(split_sum_softmax, B, S, N, 16, 4, target=target)
    assert [c.ir_before.name for c in k.kernels] == ["lse_kernel0", "lse_kernel1"]
    assert [p.name for p in k.params] == ["X", "Out"] and k.out_idx == [1]
    for seed in (1, 2):
        x = randn(B, N, seed=seed) * 3
        torch.testing.assert_close(k(x).double(), lse_ref(x), rtol=1e-5, atol=1e-5)


def test_the_report_and_the_source_name_each_kernel():
    k = build(split_sum_softmax, 32, 4, 64, 16, 4, target="triton")
    names = ("lse_kernel0", "lse_kernel1")
    assert tuple(r.kernel for r in k.report.kernels) == names
    assert k.report.target == "triton" and k.report.backend == "tl"
    assert k.report.passes[0][0] == "frontend"
    assert all(any(n.startswith(f"{name}: ") for n, _ in k.report.passes) for name in names)
    text = str(k.report)
    assert "2 kernels, launched in order" in text and all(f"kernel {n}:" in text for n in names)
    source = k.get_kernel_source()
    assert all(f"def {n}(" in source for n in names)
    assert all(n in k.asm["tir"] and n in k.asm["tl"] for n in names)


def center_rows(target):
    """Eager style: the row sums go to a workspace; an output, a Python value and a second
    workspace are declared between the two kernels; the second kernel centers each row."""
    @tilews.jit(target=target)
    def center(X, bm=16):
        M, N = T.const("M, N")
        X: T.Tensor((M, N), T.float32)
        sums = T.alloc_global((M,), T.float32)
        with T.Kernel(M // bm, threads=128) as bx:
            t = T.alloc_fragment((bm, N), T.float32)
            r = T.alloc_fragment((bm,), T.float32)
            T.copy(X[bx * bm, 0], t)
            T.reduce_sum(t, r, dim=1)
            T.copy(r, sums[bx * bm])
        Y = T.empty((M, N), T.float32)
        scale = 1.0 / N
        doubled = T.alloc_global((M,), T.float32)
        with T.Kernel(M // bm, threads=128) as bx:
            s = T.alloc_fragment((bm,), T.float32)
            T.copy(sums[bx * bm], s)
            for i in T.Parallel(bm):
                doubled[bx * bm + i] = s[i] * 2
            for i, j in T.Parallel(bm, N):
                Y[bx * bm + i, j] = X[bx * bm + i, j] - s[i] * scale
        return Y
    return center


@pytest.mark.parametrize("target", CPU_TARGETS)
def test_eager_style_with_code_between_the_kernels(target):
    center = center_rows(target)
    x = randn(32, 8, seed=3)
    torch.testing.assert_close(center(x).double(), x.double() - x.double().mean(dim=1, keepdim=True),
                               rtol=1e-5, atol=1e-5)
    kernel = center.compile(x)
    assert len(kernel.kernels) == 2 and [p.name for p in kernel.params] == ["X", "Y"]
    assert [b.name for b in kernel.binder.function.scratch] == ["sums", "doubled"]


def split_k_gemm(M, N, K, bm, bn, bk, splits):
    """Split-K GEMM: the first kernel writes each split's partial product to a workspace, the
    second sums the partials into C."""
    per = K // splits

    @T.prim_func
    def gemm(A: T.Tensor((M, K), T.float16), B: T.Tensor((K, N), T.float16),
             C: T.Tensor((M, N), T.float32)):
        partial = T.alloc_global((splits, M, N), T.float32)
        with T.Kernel(N // bn, M // bm, splits, threads=128) as (bx, by, bz):
            a = T.alloc_shared((bm, bk), T.float16)
            b = T.alloc_shared((bk, bn), T.float16)
            acc = T.alloc_fragment((bm, bn), T.float32)
            T.clear(acc)
            for k in T.Pipelined(per // bk, num_stages=2):
                T.copy(A[by * bm, bz * per + k * bk], a)
                T.copy(B[bz * per + k * bk, bx * bn], b)
                T.gemm(a, b, acc)
            T.copy(acc, partial[bz, by * bm, bx * bn])
        with T.Kernel(N // bn, M // bm, threads=128) as (bx, by):
            acc = T.alloc_fragment((bm, bn), T.float32)
            part = T.alloc_fragment((bm, bn), T.float32)
            T.clear(acc)
            for s in T.serial(splits):
                T.copy(partial[s, by * bm, bx * bn], part)
                for i, j in T.Parallel(bm, bn):
                    acc[i, j] += part[i, j]
            T.copy(acc, C[by * bm, bx * bn])
    return gemm


@pytest.mark.parametrize("target", CPU_TARGETS)
def test_split_k_gemm(target):
    M, N, K = 32, 32, 128
    k = build(split_k_gemm, M, N, K, 16, 16, 32, 2, target=target)
    a, b = randn(M, K, dtype=torch.float16, seed=4), randn(K, N, dtype=torch.float16, seed=5)
    torch.testing.assert_close(k(a, b).double(), a.double() @ b.double(), rtol=1e-4, atol=1e-3)


def test_hopper_takes_a_chain_per_kernel():
    """Compile-only: the warp-specialized Gluon backend takes the pipelined GEMM; it refuses the
    combine (nothing to specialize), which the tl fallback takes."""
    k = build(split_k_gemm, 1024, 1024, 1024, 128, 128, 64, 4, target="hopper")
    first, second = k.kernels
    assert (first.report.backend, second.report.backend) == ("gluon", "tl"), k.report
    assert first.report.target == "hopper" and second.report.target == "hopper -> triton"
    assert k.report.target == "gemm_kernel0: hopper; gemm_kernel1: hopper -> triton"
    assert any("the gluon backend refused the program" in n for n in second.report.notes)


def split_kv_decode(batch, heads, seqlen, dim, block_N, splits):
    """Split-KV decoding at a reduced size: the first kernel runs attention of every head of a
    batch row over one slice of the keys (scores, a running softmax, the values' weighted sum)
    and leaves the slice's output and log2-sum-exp in workspaces; the second kernel, one block per
    (head, row), weighs the slices' outputs by their share of the total (``T.alloc_var`` scalars)."""
    per = seqlen // splits
    scale = dim ** -0.5 * 1.44269504     # log2(e): exp2 below

    @T.prim_func
    def decode(Q: T.Tensor((batch, heads, dim), T.float16), K: T.Tensor((batch, seqlen, dim), T.float16),
               V: T.Tensor((batch, seqlen, dim), T.float16), O: T.Tensor((batch, heads, dim), T.float16)):
        lse = T.alloc_global((batch, heads, splits), T.float32)
        partial = T.alloc_global((batch, heads, splits, dim), T.float32)
        with T.Kernel(batch, splits, threads=128) as (b, sid):
            q = T.alloc_shared((heads, dim), T.float16)
            k = T.alloc_shared((block_N, dim), T.float16)
            v = T.alloc_shared((block_N, dim), T.float16)
            s = T.alloc_fragment((heads, block_N), T.float32)
            p = T.alloc_fragment((heads, block_N), T.float16)
            acc = T.alloc_fragment((heads, dim), T.float32)
            top = T.alloc_fragment((heads,), T.float32)
            top_prev = T.alloc_fragment((heads,), T.float32)
            row = T.alloc_fragment((heads,), T.float32)
            total = T.alloc_fragment((heads,), T.float32)
            T.copy(Q[b, 0, 0], q)
            T.clear(acc)
            T.clear(total)
            T.fill(top, -T.infinity(T.float32))
            for t in T.Pipelined(per // block_N, num_stages=2):
                T.copy(K[b, sid * per + t * block_N, 0], k)
                T.clear(s)
                T.gemm(q, k, s, transpose_B=True)
                T.copy(top, top_prev)
                T.reduce_max(s, top, dim=1, clear=False)
                for i, j in T.Parallel(heads, block_N):
                    s[i, j] = T.exp2(s[i, j] * scale - top[i] * scale)
                T.reduce_sum(s, row, dim=1)
                for i in T.Parallel(heads):
                    total[i] = total[i] * T.exp2(top_prev[i] * scale - top[i] * scale) + row[i]
                for i, j in T.Parallel(heads, dim):
                    acc[i, j] *= T.exp2(top_prev[i] * scale - top[i] * scale)
                T.copy(s, p)
                T.copy(V[b, sid * per + t * block_N, 0], v)
                T.gemm(p, v, acc)
            for i, j in T.Parallel(heads, dim):
                partial[b, i, sid, j] = acc[i, j] / total[i]
            for i in T.Parallel(heads):
                lse[b, i, sid] = T.log2(total[i]) + top[i] * scale
        with T.Kernel(heads, batch, threads=128) as (h, b):
            out = T.alloc_fragment((dim,), T.float32)
            top = T.alloc_var(T.float32)
            total = T.alloc_var(T.float32)
            weight = T.alloc_var(T.float32)
            T.clear(total)
            T.clear(out)
            top = -T.infinity(T.float32)
            for sid in T.serial(splits):
                top = T.max(top, lse[b, h, sid])
            for sid in T.serial(splits):
                total += T.exp2(lse[b, h, sid] - top)
            for sid in T.serial(splits):
                weight = T.exp2(lse[b, h, sid] - top) / total
                for j in T.Parallel(dim):
                    out[j] += partial[b, h, sid, j] * weight
            for j in T.Parallel(dim):
                O[b, h, j] = out[j]
    return decode


def attention_ref(q, k, v):
    scores = torch.einsum("bhd,bsd->bhs", q.double(), k.double()) * q.shape[-1] ** -0.5
    return torch.einsum("bhs,bsd->bhd", scores.softmax(-1), v.double())


@pytest.mark.parametrize("target", CPU_TARGETS)
def test_split_kv_decode(target):
    batch, heads, seqlen, dim = 2, 16, 128, 32
    k = build(split_kv_decode, batch, heads, seqlen, dim, 16, 4, target=target)
    q, kk, v = (randn(*shape, dtype=torch.float16, seed=i) for i, shape in
                enumerate([(batch, heads, dim), (batch, seqlen, dim), (batch, seqlen, dim)]))
    torch.testing.assert_close(k(q, kk, v).double(), attention_ref(q, kk, v), rtol=2e-2, atol=2e-2)


def test_workspaces_are_reused_per_stream(monkeypatch):
    """A call reuses the workspaces of an earlier call of the same shapes on the same stream; a
    call on another stream (a stand-in stream key on the CPU) gets its own."""
    k = build(split_sum_softmax, 32, 4, 64, 16, 4, target="interpret")
    x = randn(32, 64, seed=7)
    k(x)
    [first] = k.binder.workspaces.values()
    assert [tuple(t.shape) for t in first] == [(32, 4), (32, 4)]
    k(x * 2)
    [again] = k.binder.workspaces.values()
    assert all(a is b for a, b in zip(first, again))
    monkeypatch.setattr(tilews.binding, "stream_key", lambda device: (device, "another stream"))
    torch.testing.assert_close(k(x).double(), lse_ref(x), rtol=1e-5, atol=1e-5)
    assert len(k.binder.workspaces) == 2
    other = k.binder.workspaces[((torch.device("cpu"), "another stream"), ((32, 4), (32, 4)))]
    assert not any(a is b for a in first for b in other)


def test_workspace_shapes_follow_runtime_dimensions():
    """A workspace sized by a runtime dimension: a call of another size gets other workspaces."""
    def f(N, bm):
        @T.prim_func
        def twice(X: T.Tensor((T.dynamic("m"), N), T.float32), Y: T.Tensor((T.dynamic("m"), N), T.float32)):
            m = T.dynamic("m")
            staged = T.alloc_global((m, N), T.float32)
            with T.Kernel(T.ceildiv(m, bm), threads=128) as bx:
                t = T.alloc_fragment((bm, N), T.float32)
                T.copy(X[bx * bm, 0], t)
                for i, j in T.Parallel(bm, N):
                    t[i, j] = t[i, j] * 2
                T.copy(t, staged[bx * bm, 0])
            with T.Kernel(T.ceildiv(m, bm), threads=128) as bx:
                t = T.alloc_fragment((bm, N), T.float32)
                T.copy(staged[bx * bm, 0], t)
                for i, j in T.Parallel(bm, N):
                    t[i, j] = t[i, j] + X[bx * bm + i, j]
                T.copy(t, Y[bx * bm, 0])
        return twice
    k = build(f, 8, 16, target="interpret")
    for m in (16, 48, 16):
        x = randn(m, 8, seed=m)
        torch.testing.assert_close(k(x).double(), x.double() * 3)
    assert sorted(key[1] for key in k.binder.workspaces) == [((16, 8),), ((48, 8),)]


def test_the_stream_key_tells_cuda_streams_apart():
    from tilews.binding import stream_key
    cpu = torch.device("cpu")
    assert stream_key(cpu) == stream_key(cpu) == (cpu,)
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA for a second stream")
    dev = torch.device("cuda", torch.cuda.current_device())
    here = stream_key(dev)
    with torch.cuda.stream(torch.cuda.Stream(dev)):
        assert stream_key(dev) != here


def test_a_kernel_may_read_a_workspace_no_kernel_wrote():
    """TileLang allows it (the workspace holds what it holds): it compiles and runs; the
    workspace starts poisoned under the tests' settings (TILEWS_POISON_OUTPUTS), so reads of it
    come out NaN."""
    def f(M, bm):
        @T.prim_func
        def main(X: T.Tensor((M,), T.float32), Y: T.Tensor((M,), T.float32), Z: T.Tensor((M,), T.float32)):
            unwritten = T.alloc_global((M,), T.float32)
            with T.Kernel(M // bm, threads=128) as bx:
                for i in T.Parallel(bm):
                    Y[bx * bm + i] = X[bx * bm + i] + 1
            with T.Kernel(M // bm, threads=128) as bx:
                for i in T.Parallel(bm):
                    Z[bx * bm + i] = unwritten[bx * bm + i]
        return main
    k = build(f, 32, 16, target="interpret", out_idx=[1, 2])
    x = randn(32, seed=8)
    y, z = k(x)
    torch.testing.assert_close(y.double(), x.double() + 1)
    assert z.shape == (32,) and z.isnan().all()


def test_a_kernel_inside_a_kernel_is_an_error_at_its_line():
    def f(M):
        @T.prim_func
        def main(X: T.Tensor((M,), T.float32)):
            with T.Kernel(1, threads=128) as bx:
                with T.Kernel(1, threads=128) as by:  # <- error
                    X[by] = bx
        return main
    with pytest.raises(tilews.CompileError) as info:
        build(f, 32)
    assert "T.Kernel inside another T.Kernel" in info.value.message
    assert info.value.loc.line == marked_line(f)


def test_build_kernel_names_the_several_kernels():
    """The single-kernel entry point refuses a function of two kernels (build_function takes it)."""
    from tilews.lowering.frontend import build_function, build_kernel
    src = split_sum_softmax(32, 4, 64, 16, 4)
    function = build_function(src)
    assert isinstance(function, ir.Function) and len(function.kernels) == 2
    assert all(k.params == function.params and k.scratch == function.scratch for k in function.kernels)
    assert function.kernels[0].block_vars != function.kernels[1].block_vars
    with pytest.raises(tilews.CompileError, match="has 2 T.Kernel blocks"):
        build_kernel(src)


def test_the_profiler_runs_every_kernel():
    k = build(split_sum_softmax, 32, 4, 64, 16, 4, target="interpret")
    profiler = k.get_profiler(tilews.TensorSupplyType.Normal)
    profiler.assert_allclose(lambda x: lse_ref(x).float(), rtol=1e-4, atol=1e-4)
    assert profiler.do_bench(n_warmup=1, n_repeat=1) > 0


def test_a_kernels_names_are_its_own():
    """A name the first kernel bound (an on-chip buffer) is not defined in the second: a
    CompileError at the use, saying so; a workspace declared inside the first is visible."""
    def f(M, bm):
        @T.prim_func
        def main(X: T.Tensor((M,), T.float32), Y: T.Tensor((M,), T.float32)):
            with T.Kernel(M // bm, threads=128) as bx:
                staged = T.alloc_global((M,), T.float32)
                t = T.alloc_fragment((bm,), T.float32)
                T.copy(X[bx * bm], t)
                T.copy(t, staged[bx * bm])
            with T.Kernel(M // bm, threads=128) as bx:
                for i in T.Parallel(bm):
                    Y[bx * bm + i] = staged[bx * bm + i] * 2
        return main
    k = build(f, 32, 16)
    x = randn(32, seed=9)
    torch.testing.assert_close(k(x).double(), x.double() * 2)

    def g(M, bm):
        @T.prim_func
        def main(X: T.Tensor((M,), T.float32), Y: T.Tensor((M,), T.float32)):
            with T.Kernel(M // bm, threads=128) as bx:
                t = T.alloc_fragment((bm,), T.float32)
                T.copy(X[bx * bm], t)
            with T.Kernel(M // bm, threads=128) as by:
                T.copy(t, Y[by * bm])  # <- error
        return main
    with pytest.raises(tilews.CompileError) as info:
        build(g, 32, 16)
    assert "'t' was assigned inside a T.Kernel block" in info.value.message
    assert info.value.loc.line == marked_line(g)


def test_kernels_inside_macros():
    """Each kernel written in a T.macro the function calls (the split and combine steps named)."""
    def f(M, bm):
        @T.macro
        def scale_into(X, W, c):
            with T.Kernel(M // bm, threads=128) as bx:
                for i in T.Parallel(bm):
                    W[bx * bm + i] = X[bx * bm + i] * c

        @T.macro
        def add_into(X, W, Y):
            with T.Kernel(M // bm, threads=128) as bx:
                for i in T.Parallel(bm):
                    Y[bx * bm + i] = X[bx * bm + i] + W[bx * bm + i]

        @T.prim_func
        def main(X: T.Tensor((M,), T.float32), Y: T.Tensor((M,), T.float32)):
            w = T.alloc_global((M,), T.float32)
            scale_into(X, w, 3.0)
            add_into(X, w, Y)
        return main
    k = build(f, 32, 16)
    assert len(k.kernels) == 2
    x = randn(32, seed=10)
    torch.testing.assert_close(k(x).double(), x.double() * 4)


def test_each_tl_kernel_is_passed_only_the_parameters_it_names():
    """A function's kernels all take its parameters; on ``tl`` each is passed only those its code
    names (``StreamPlan.passed_params``): decode's combine kernel reads the partials, their
    log-sum-exps and the output, not the query, the caches or the lengths (the two-kernel form,
    ``fused=False``)."""
    from tilews.lowering.plans import StreamPlan
    from tilews.ops import decode as dec
    kernel = dec._jit(dec.decode_program, "triton")(1, 8, 2, 64, 64, 2, T.float16, None, True, None,
                                                    **dec.blocks(64, gpu=False), fused=False)
    split, combine = (k.ir_after.plan(StreamPlan).passed_params for k in kernel.kernels)
    assert "Q" in split and "K" in split and "cache_seqlens" in split
    assert set(combine) == {"Out"} | {b.name for b in kernel.kernels[1].ir_after.scratch}
    [signature] = [line for line in kernel.kernels[1].program.source.splitlines()
                   if line.startswith("def decode_ragged_kernel1(")]
    params = signature[signature.index("(") + 1:signature.index(")")].split(", ")
    assert "Out" in params and "Q" not in params and "K" not in params, params
