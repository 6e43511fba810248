"""Runtime: argument checks before launch, out_idx, direct style specialization, the compile
report, in-memory and on-disk caches (hit, corruption, concurrent processes)."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
import torch

import tilews
import tilews.language as T

from .helpers import randn, rel_err


def add_factory(M, N, dtype=T.float32):
    @T.prim_func
    def main(X: T.Tensor((M, N), dtype), Y: T.Tensor((M, N), dtype), Z: T.Tensor((M, N), dtype)):
        with T.Kernel(T.ceildiv(M, 16), threads=128) as bx:
            for i, j in T.Parallel(16, N):
                Z[bx * 16 + i, j] = X[bx * 16 + i, j] + Y[bx * 16 + i, j]
    return main


add = tilews.jit(out_idx=[-1], target="interpret")(add_factory)


def test_argument_checks_name_the_parameter():
    k = add(32, 8)
    x, y = randn(32, 8), randn(32, 8)
    with pytest.raises(TypeError, match=r"takes 2 argument\(s\) \(X, Y\), got 1"):
        k(x)
    with pytest.raises(TypeError, match="parameter 'Y' must be a torch.Tensor, got int"):
        k(x, 3)
    with pytest.raises(TypeError, match="parameter 'X' has dtype torch.float16, expected torch.float32"):
        k(x.half(), y)
    with pytest.raises(ValueError, match=r"parameter 'Y' has shape \(32, 9\), expected \(32, 8\)"):
        k(x, randn(32, 9))
    with pytest.raises(ValueError, match="parameter 'X' has 1 dimensions"):
        k(randn(256), y)


def test_written_parameter_must_not_alias():
    k = tilews.jit(target="interpret")(add_factory)(32, 8)
    x, y = randn(32, 8), randn(32, 8)
    with pytest.raises(ValueError, match="parameter 'Z' is written by the kernel but has overlapping"):
        k(x, y, torch.zeros(1, 8).expand(32, 8))


def split_factory(N):
    @T.prim_func
    def main(X: T.Tensor((N,), T.float32), Y: T.Tensor((N,), T.float32), Z: T.Tensor((N,), T.float32)):
        with T.Kernel(1, threads=128) as bx:
            for i in T.Parallel(N):
                Y[i] = X[i] + 1
                Z[i] = X[i] * 2
    return main


def test_written_tensor_must_not_overlap_another_argument():
    # issue 9: an output aliasing an input, or two outputs sharing memory, ran silently.
    k = tilews.jit(target="interpret")(add_factory)(32, 8)
    x, y, z = randn(32, 8, seed=1), randn(32, 8, seed=2), torch.empty(32, 8)
    with pytest.raises(ValueError, match="parameters 'X' and 'Z' overlap in memory, and the kernel "
                                         "writes 'Z'"):
        k(x, y, x)
    rows = randn(64, 8)
    with pytest.raises(ValueError, match="parameters 'Y' and 'Z' overlap in memory"):
        k(x, rows[:32], rows[16:48])                   # a view overlapping part of the output
    k(x, x, z)                                         # reading one tensor twice is fine
    assert rel_err(z, 2 * x.double()) < 1e-7
    k(rows[:32], y, rows[32:])                         # adjacent halves of one storage
    assert rel_err(rows[32:], rows[:32].double() + y.double()) < 1e-7
    two = tilews.jit(target="interpret")(split_factory)(16)
    buf = torch.empty(16)
    with pytest.raises(ValueError, match="parameters 'Y' and 'Z' overlap in memory, and the kernel "
                                         "writes both"):
        two(randn(16), buf, buf)


def test_overlap_is_checked_on_every_call_of_a_known_signature():
    # the check a known signature still runs: the written tensor's span against the others'
    k = tilews.jit(target="interpret")(add_factory)(32, 8)
    rows = randn(96, 8, seed=3)
    x, y, z = rows[:32], rows[32:64], rows[64:]
    k(x, y, z)                                          # the signature is learned here
    assert rel_err(z, x.double() + y.double()) < 1e-7
    for args, named in (((x, y, x), "'X' and 'Z'"), ((x, rows[40:72], rows[32:64]), "'Y' and 'Z'")):
        with pytest.raises(ValueError, match=f"parameters {named} overlap in memory"):
            k(*args)
        with pytest.raises(ValueError, match=f"parameters {named} overlap in memory"):
            k.binder.bound((x, y, z))(*args)
    k(rows[32:64], rows[64:], rows[:32])                # the same storage, disjoint spans
    assert rel_err(rows[:32], rows[32:64].double() + rows[64:].double()) < 1e-7


def test_tensor_without_data_or_on_an_unsupported_device_is_named():
    # issue 9: a meta tensor crashed inside torch (or blamed the next parameter's device).
    k = add(32, 8)
    meta = torch.empty(32, 8, device="meta")
    with pytest.raises(ValueError, match="parameter 'X' is on device meta, which holds no data; "
                                         "pass a CPU, CUDA or MPS tensor"):
        k(meta, randn(32, 8))
    with pytest.raises(ValueError, match="parameter 'Y' is on device meta"):
        k(randn(32, 8), meta)


def scalar_factory(dtype):
    @T.prim_func
    def main(X: T.Tensor((8,), T.float32), s: dtype, Y: T.Tensor((8,), T.float32)):
        with T.Kernel(1, threads=128) as bx:
            for i in T.Parallel(8):
                Y[i] = X[i] + s
    return main


def test_runtime_scalar_must_fit_its_dtype():
    # issue 9: an int32 scalar of 2**40 was wrapped by the interpreter and not by Triton.
    scalar = tilews.jit(out_idx=[-1], target="interpret")(scalar_factory)
    x = randn(8)
    with pytest.raises(ValueError, match=r"parameter 's' is 1099511627776, outside the range of "
                                         r"T.int32 \[-2147483648, 2147483647\]"):
        scalar(T.int32)(x, 2 ** 40)
    assert rel_err(scalar(T.int32)(x, -2 ** 31), x.double() - 2 ** 31) < 1e-7
    with pytest.raises(ValueError, match=r"outside the range of T.int8 \[-128, 127\]"):
        scalar(T.int8)(x, 128)
    with pytest.raises(ValueError, match=r"outside the range of T.uint8 \[0, 255\]"):
        scalar(T.uint8)(x, -1)
    with pytest.raises(ValueError, match=r"parameter 's' is 1e\+39, outside the finite range of "
                                         r"T.float32"):
        scalar(T.float32)(x, 1e39)
    with pytest.raises(ValueError, match="outside the finite range of T.float16"):
        scalar(T.float16)(x, 65520.0)              # rounds to inf
    scalar(T.float16)(x, 65519.0)                  # rounds to 65504, the largest half
    scalar(T.float32)(x, float("-inf"))            # an explicit inf is the caller's choice
    with pytest.raises(ValueError, match="outside the finite range of T.float64"):
        scalar(T.float64)(x, 10 ** 400)


def test_unknown_jit_option_lists_the_targets_options():
    # issue 9: a misspelt option (num_wraps, sed) was ignored.
    with pytest.raises(TypeError, match="tilews.jit\\(\\) got unknown option\\(s\\) num_wraps; "
                                        "target 'interpret' takes accumulate_f64, seed"):
        tilews.jit(target="interpret", num_wraps=4)
    with pytest.raises(TypeError, match="unknown option\\(s\\) sed; target 'interpret' takes"):
        tilews.jit(out_idx=[-1], target="interpret", sed=1)(add_factory)
    with pytest.raises(TypeError, match="unknown option\\(s\\) seed; target 'triton' takes no options"):
        tilews.jit(target="triton", seed=1)
    assert tilews.jit(target="interpret", seed=3)(add_factory)(32, 8).target == "interpret"


@tilews.jit(out_idx=[-1], target="interpret")
def row_sums(A: T.Tensor[("M", "K"), T.float32], S: T.Tensor[("M",), T.float32]):
    with T.Kernel(1) as bx:
        for i in T.Parallel(M):
            S[i] = A[i, 0]


def test_zero_size_named_dimension_names_the_value():
    # issue 9: K = 0 read "dimension 0 of parameter 'A' must be a positive int" (0 read as an index).
    with pytest.raises(ValueError, match=r"parameter 'A' has size 0 in dimension 1 \(K = 0\); a named "
                                         r"dimension must be positive"):
        row_sums(torch.empty(4, 0))


def test_out_idx_allocates_and_computes():
    k = add(40, 8)                   # 40 rows: the last block is partial
    x, y = randn(40, 8, seed=1), randn(40, 8, seed=2)
    z = k(x, y)
    assert z.shape == (40, 8) and z.dtype == torch.float32 and z.device == x.device
    assert rel_err(z, x.double() + y.double()) < 1e-7


def test_in_memory_cache_returns_the_same_kernel():
    assert add(32, 8) is add(32, 8)
    assert add(32, 8) is not add(32, 16)


def test_report_and_sources():
    k = add(32, 8)
    assert k.target == "interpret"
    text = str(k.report)
    assert "target: interpret" in text and "passes: frontend" in text
    assert "kernel main(" in k.get_kernel_source()
    assert "tir" in k.asm
    assert "parallel i < 16, j < 8" in k.ir_text("before")


def test_bad_target_and_out_idx():
    with pytest.raises(ValueError, match="must be one of auto, interpret, triton, hopper, metal, cuda"):
        tilews.jit(target="sm90")
    with pytest.raises(ValueError, match="out_idx 5 is out of range"):
        tilews.jit(out_idx=[5], target="interpret")(add_factory)(32, 8)
    assert tilews.jit(target="metal")(add_factory)(32, 8).report.target == "metal"


def handoff_out_of_source_order():
    """ws(1) waits for what ws(0) writes later in source order: correct concurrently, impossible
    as one stream; and the Gluon emitter does not spell element stores to shared memory."""
    @T.prim_func
    def main(X: T.Tensor((16,), T.float32), Y: T.Tensor((16,), T.float32)):
        with T.Kernel(1, threads=256) as bx:
            X_s = T.alloc_shared((16,), T.float32)
            ready = T.alloc_barrier(arrive_count=128)
            with T.ws(1):
                T.barrier_wait(ready, 0)
                for i in T.Parallel(16):
                    Y[i] = X_s[i] * 2.0
            with T.ws(0):
                for i in T.Parallel(16):
                    X_s[i] = X[i]
                T.barrier_arrive(ready)
    return main


def test_a_refusal_is_reported_before_the_fallbacks_complaint():
    with pytest.raises(tilews.CompileError) as e:
        tilews.jit(target="hopper")(handoff_out_of_source_order)()
    message = str(e.value)
    assert message.index("the gluon backend refused the program (a store to shared buffer 'X_s' "
                         "inside T.Parallel") < message.index("the tl backend cannot compile it either")
    assert "test_runtime.py" in message.splitlines()[0]      # the user's line
    x = randn(16)
    y = tilews.jit(out_idx=[-1], target="interpret")(handoff_out_of_source_order)()(x)
    assert torch.equal(y, x * 2)


def test_hopper_falls_back_to_triton_language_with_the_reason():
    k = tilews.jit(out_idx=[-1], target="hopper")(add_factory)(32, 16)
    assert k.target == "hopper -> triton"
    assert k.report.backend == "tl"
    assert any(n.startswith("hopper: the gluon backend refused the program (the program has no "
                            "warp-specialized form") and n.endswith("; using tl") for n in k.report.notes), \
        k.report.notes
    x, y = randn(32, 16, seed=11), randn(32, 16, seed=12)
    assert rel_err(k(x, y), x.double() + y.double()) < 1e-6


def deep_ring_gemm(M, N, K, block_M, block_N, block_K, stages):
    """A pipelined GEMM whose warp-specialized ring (stages x one A and one B tile) is the whole of
    its shared memory."""
    @T.prim_func
    def main(A: T.Tensor((M, K), T.float16), B: T.Tensor((K, N), T.float16),
             C: T.Tensor((M, N), T.float32)):
        with T.Kernel(T.ceildiv(N, block_N), T.ceildiv(M, block_M), threads=256) as (bx, by):
            A_s = T.alloc_shared((block_M, block_K), T.float16)
            B_s = T.alloc_shared((block_K, block_N), T.float16)
            acc = T.alloc_fragment((block_M, block_N), T.float32)
            T.clear(acc)
            for k in T.Pipelined(T.ceildiv(K, block_K), num_stages=stages):
                T.copy(A[by * block_M, k * block_K], A_s)
                T.copy(B[k * block_K, bx * block_N], B_s)
                T.gemm(A_s, B_s, acc)
            T.copy(acc, C[by * block_M, bx * block_N])
    return main


def test_a_backend_whose_schedule_outgrows_shared_memory_falls_back():
    """Gluon's 4-stage ring of 64 KB stages exceeds Hopper's 232448 bytes: a ResourceLimitError
    is that backend's refusal, and tl (which multi-buffers within what Triton fits) takes it;
    where the last backend is out of room too, the user sees both reasons at the kernel."""
    k = tilews.jit(out_idx=[-1], target="hopper")(deep_ring_gemm)(512, 512, 512, 128, 256, 128, 4)
    assert k.report.backend == "tl"
    assert any(n.startswith("hopper: the gluon backend cannot fit the program (kernel 'main' needs")
               and n.endswith("; using tl") for n in k.report.notes), k.report.notes
    with pytest.raises(tilews.CompileError) as e:
        tilews.jit(out_idx=[-1], target="hopper")(deep_ring_gemm)(512, 2048, 512, 128, 1024, 128, 4)
    message = str(e.value)
    assert message.index("the gluon backend cannot fit the program") < \
        message.index("the tl backend cannot compile it either: kernel 'main' needs")
    assert "test_runtime.py" in message.splitlines()[0]


@tilews.jit(out_idx=[-1], target="interpret")
def scale_rows(X: T.Tensor[("M", "N"), T.float32], Y: T.Tensor[("M", "N"), T.float32], factor=2.0):
    with T.Kernel(T.ceildiv(M, 8)) as bx:
        for i, j in T.Parallel(8, N):
            Y[bx * 8 + i, j] = X[bx * 8 + i, j] * factor


def test_direct_style_specializes_on_names_and_constants():
    x = randn(20, 4)
    y = scale_rows(x)
    assert rel_err(y, 2 * x.double()) < 1e-7
    y3 = scale_rows(x, factor=3.0)
    assert rel_err(y3, 3 * x.double()) < 1e-7
    y2 = scale_rows(randn(9, 16, seed=3))
    assert y2.shape == (9, 16)
    assert len(scale_rows._kernels) == 3
    scale_rows(randn(20, 4, seed=4))
    assert len(scale_rows._kernels) == 3          # same dims and constants: no recompilation


@tilews.jit(out_idx=[-1], target="interpret")
def dyn_copy(X: T.Tensor[(T.dynamic("m"), 8), T.float32], Y: T.Tensor[(T.dynamic("m"), 8), T.float32]):
    with T.Kernel(T.ceildiv(m, 4)) as bx:
        for i, j in T.Parallel(4, 8):
            Y[bx * 4 + i, j] = X[bx * 4 + i, j] + 1


def test_dynamic_dims_do_not_recompile():
    for m in (5, 13, 4):
        x = randn(m, 8, seed=m)
        assert rel_err(dyn_copy(x), x.double() + 1) < 1e-7
    assert len(dyn_copy._kernels) == 1
    with pytest.raises(ValueError, match="dimension 0 of 'Y' is 5, but 'm' is 4 from 'X'"):
        tilews.jit(target="interpret")(dyn_copy.fn)(randn(4, 8), randn(5, 8))


def _subprocess_lines(cache_dir, extra=""):
    """The lines a fresh process prints that compiles ``add(32, 8)`` with ``cache_dir`` as its
    cache (after running ``extra``; warnings are errors there), the last one HIT or MISS."""
    code = textwrap.dedent(f"""
        import sys, warnings
        sys.path.insert(0, {os.path.dirname(os.path.dirname(os.path.abspath(__file__)))!r})
        from tests.test_runtime import add
        warnings.simplefilter("error")
        {extra}
        k = add(32, 8)
        print("HIT" if k.report.cache_hit else "MISS")
    """)
    env = dict(os.environ, TILEWS_CACHE_DIR=str(cache_dir))
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip().splitlines()


def _compile_in_subprocess(cache_dir, extra=""):
    return _subprocess_lines(cache_dir, extra)[-1]


def test_disk_cache_hit_in_a_new_process(tmp_path):
    assert _compile_in_subprocess(tmp_path) == "MISS"
    assert _compile_in_subprocess(tmp_path) == "HIT"


def test_corrupted_disk_entry_is_recompiled(tmp_path, monkeypatch):
    # every compile in a fresh process: this one's may key the entry differently (state an
    # earlier test left in the process, which the full suite's order decides) and never read it;
    # the cache switches as a fresh process has them (a TileLang example run in this process
    # before may have called disable_cache(), which sets them for the process)
    for name in ("TILEWS_DISABLE_CACHE", "TILELANG_DISABLE_CACHE"):
        monkeypatch.delenv(name, raising=False)
    assert _compile_in_subprocess(tmp_path) == "MISS"
    entries = list(tmp_path.rglob("*.bin"))
    assert len(entries) == 1
    data = bytearray(entries[0].read_bytes())
    data[-10] ^= 0xFF
    entries[0].write_bytes(bytes(data))
    said = ("from tilews.cache import CacheCorruptionWarning; "
            "warnings.simplefilter('always', CacheCorruptionWarning); "
            "warnings.showwarning = lambda message, category, *rest: print(category.__name__)")
    assert _subprocess_lines(tmp_path, said) == ["CacheCorruptionWarning", "MISS"]
    assert _compile_in_subprocess(tmp_path) == "HIT"        # the rebuilt entry
    k = tilews.jit(out_idx=[-1], target="interpret")(add_factory)(32, 8)
    x, y = randn(32, 8), randn(32, 8)
    assert rel_err(k(x, y), x.double() + y.double()) < 1e-7


def test_concurrent_processes_share_one_compile(tmp_path):
    env = dict(os.environ, TILEWS_CACHE_DIR=str(tmp_path))
    code = ("import sys; sys.path.insert(0, %r); from tests.test_runtime import add; "
            "k = add(32, 8); print('HIT' if k.report.cache_hit else 'MISS')"
            % os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    procs = [subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(3)]
    results = [p.communicate(timeout=120) for p in procs]
    assert all(p.returncode == 0 for p in procs), [r[1] for r in results]
    outcomes = sorted(r[0].strip().splitlines()[-1] for r in results)
    assert outcomes == ["HIT", "HIT", "MISS"]


def test_the_disk_cache_key_covers_tilews_sources(tmp_path, monkeypatch):
    """A change to a pass or an emitter must not be answered by code generated before it."""
    from tilews import compiler
    files = {str(p.relative_to(p.parents[2])) if "passes" in p.parts else p.name
             for p in compiler.source_files()}
    assert {"lowering/passes/legalize.py", "emit.py", "compiler.py", "backend.py"} <= files
    monkeypatch.setenv("TILEWS_CACHE_DIR", str(tmp_path))
    first = tilews.jit(out_idx=[-1], target="interpret")(add_factory)(32, 8)
    again = tilews.jit(out_idx=[-1], target="interpret")(add_factory)(32, 8)
    assert (first.report.cache_hit, again.report.cache_hit) == (False, True)
    monkeypatch.setattr(compiler, "sources_digest", lambda: "an edited pass")
    edited = tilews.jit(out_idx=[-1], target="interpret")(add_factory)(32, 8)
    assert not edited.report.cache_hit
