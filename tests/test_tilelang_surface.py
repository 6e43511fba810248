"""TileLang's Python-side names that its example tests reach, on tilews (CPU only): the skip
markers of ``tilews.testing`` (decided on a patched torch capability), ``torch_assert_close``,
``set_random_seed``, ``main``; ``tilews.utils.tensor``'s ``get_tensor_supply``; ``tilews.math``;
``tilews.contrib.nvcc``; ``tilews.language.dtypes``; ``tilews.compile``, ``tilews.lower`` /
``tilews.engine.lower``, ``tilews.JITKernel`` and ``tilews.DataType``."""
from __future__ import annotations

import importlib
import random
import subprocess
import sys
import textwrap
import types

import numpy as np
import pytest
import torch

import tilews
import tilews.language as T
import tilews.testing
from tilews.contrib import nvcc
from tilews.kernel import KernelParam
from tilews.language.dtypes import _TORCH_DTYPE_TO_STR, dtype
from tilews.language.fp8 import determine_torch_fp8_type
from tilews.utils.tensor import TensorSupplyType, get_tensor_supply, torch_assert_close

from .helpers import marked_line, randn


def gpu(monkeypatch, capability=None, hip=None):
    """Make torch report a GPU of ``capability`` (None: no GPU; ``hip``: a ROCm one)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: capability is not None)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: capability)
    monkeypatch.setattr(torch.version, "hip", hip)


def skips(test) -> list[str]:
    """The reasons of the skip marks on ``test`` that apply (their condition holds)."""
    return [m.kwargs["reason"] for m in getattr(test, "pytestmark", [])
            if m.name == "skipif" and m.args[0]]


def a_test():
    """A fresh test function (marks accumulate on the function they decorate)."""
    def test():
        pass
    return test


# ----------------------------------------------------------------------------------------------
# skip markers


@pytest.mark.parametrize("capability, hip, skipped", [((9, 0), None, False), (None, None, True),
                                                      ((9, 0), "6.2", True)])
def test_requires_cuda(monkeypatch, capability, hip, skipped):
    gpu(monkeypatch, capability, hip)
    assert skips(tilews.testing.requires_cuda(a_test())) == (["needs a CUDA GPU"] if skipped else [])


# (marker, its arguments, the GPU's capability, whether the test is skipped)
COMPUTE_CASES = [
    ("requires_cuda_compute_version_le", (8, 9), (9, 0), True),
    ("requires_cuda_compute_version_le", (8, 9), (8, 9), False),
    ("requires_cuda_compute_version_le", (8, 9), (8, 6), False),
    ("requires_cuda_compute_version_ge", (9, 0), (8, 9), True),
    ("requires_cuda_compute_version_ge", (9,), (9, 0), False),
    ("requires_cuda_compute_version_ge", (9,), (10, 0), False),
    ("requires_cuda_compute_version_gt", (9, 0), (9, 0), True),
    ("requires_cuda_compute_version_gt", (9, 0), (10, 0), False),
    ("requires_cuda_compute_version_lt", (9, 0), (9, 0), True),
    ("requires_cuda_compute_version_lt", (9, 0), (8, 9), False),
    ("requires_cuda_compute_version_eq", (9, 0), (9, 0), False),
    ("requires_cuda_compute_version_eq", (9,), (8, 0), True),
    ("requires_cuda_compute_version_eq", (8,), (8, 6), True),
    # mode defaults to "ge", minor to 0
    ("requires_cuda_compute_version", (9,), (8, 9), True),
    ("requires_cuda_compute_version", (8, 6), (9, 0), False),
]


@pytest.mark.parametrize("marker, args, capability, skipped", COMPUTE_CASES)
def test_requires_cuda_compute_version(monkeypatch, marker, args, capability, skipped):
    gpu(monkeypatch, capability)
    reasons = skips(getattr(tilews.testing, marker)(*args)(a_test()))
    if not skipped:
        assert reasons == []
        return
    mode = marker.rpartition("_")[2] if marker.endswith(("le", "ge", "gt", "lt", "eq")) else "ge"
    want = f"{args[0]}.{args[1] if len(args) > 1 else 0}"
    assert reasons == [f"needs CUDA compute capability {mode} {want}, this machine has "
                       f"{capability[0]}.{capability[1]}"]


def test_compute_version_markers_require_cuda(monkeypatch):
    """Without a GPU the version compares as 0.0 (``le`` holds) and the CUDA mark skips."""
    gpu(monkeypatch, None)
    assert skips(tilews.testing.requires_cuda_compute_version_le(8, 9)(a_test())) == ["needs a CUDA GPU"]
    assert skips(tilews.testing.requires_cuda_compute_version_ge(8, 0)(a_test())) == [
        "needs CUDA compute capability ge 8.0, this machine has 0.0", "needs a CUDA GPU"]


def test_requires_cuda_compute_version_rejects_an_unknown_mode(monkeypatch):
    gpu(monkeypatch, (9, 0))
    with pytest.raises(ValueError, match="mode must be one of ge, gt, le, lt, eq; got 'ne'"):
        tilews.testing.requires_cuda_compute_version(9, 0, mode="ne")


def test_requires_package():
    assert skips(tilews.testing.requires_package("numpy", "torch")(a_test())) == []
    assert skips(tilews.testing.requires_package("torch", "no_such_package_xyz")(a_test())) == [
        "needs the package(s) no_such_package_xyz"]


# ----------------------------------------------------------------------------------------------
# tilews.contrib.nvcc


def test_nvcc_compute_version_from_torch(monkeypatch):
    gpu(monkeypatch, (8, 6))
    assert nvcc.get_target_compute_version() == "8.6"
    gpu(monkeypatch, (10, 0))
    assert nvcc.parse_compute_version(nvcc.get_target_compute_version()) == (10, 0)
    assert float(nvcc.get_target_compute_version()) >= 9.0     # as the flash-attention examples check


@pytest.mark.parametrize("capability, hip", [(None, None), ((9, 0), "6.2")])
def test_nvcc_without_a_cuda_gpu(monkeypatch, capability, hip):
    gpu(monkeypatch, capability, hip)
    with pytest.raises(ValueError, match="no CUDA GPU"):
        nvcc.get_target_compute_version()


def test_parse_compute_version():
    assert nvcc.parse_compute_version("12.1") == (12, 1)
    for bad in ("90", "x.0", ""):
        with pytest.raises(RuntimeError, match=f"compute version '{bad}' is not 'major.minor'"):
            nvcc.parse_compute_version(bad)


# ----------------------------------------------------------------------------------------------
# torch_assert_close


def test_torch_assert_close_is_one_function():
    assert tilews.testing.torch_assert_close is torch_assert_close
    assert tilews.utils.torch_assert_close is torch_assert_close


def test_torch_assert_close_allows_the_mismatch_budget():
    ref = randn(100, 100, seed=1)
    out = ref.clone()
    out.view(-1)[torch.arange(10) * 997] += 1.0            # 10 of 10000 = 0.1%: the default budget
    assert torch_assert_close(out, ref) is True
    assert torch_assert_close(out, ref, rtol=0, atol=1.5) is True
    with pytest.raises(AssertionError):
        torch_assert_close(out, ref, max_mismatched_ratio=0.0009)


def test_torch_assert_close_message():
    ref = randn(100, 100, seed=2)
    out = ref.clone()
    wrong = torch.arange(11) * 900 + 250                     # 11 > int(10000 * 0.001) = 10
    out.view(-1)[wrong] += 2.0
    with pytest.raises(AssertionError) as info:
        torch_assert_close(out, ref, base_name="tilews", ref_name="torch")
    msg = str(info.value)
    x, y = out[2, 50].item(), ref[2, 50].item()              # the first wrong element: flat 250
    assert msg.startswith("Too many mismatched elements: 11 > 10 (0.10% allowed, but get 0.11%).\n"
                          f"First mismatch at index [2, 50]: lhs={x:.6f}, rhs={y:.6f}, "
                          f"abs_diff={abs(x - y):.6f}, rel_diff={abs(x - y) / (abs(y) + 1e-12):.6f}\n")
    diff = (out - ref).abs()
    assert (f"\nGreatest absolute difference: {diff.max().item()}, Greatest relative difference: "
            f"{(diff / (ref.abs() + 1e-12)).max().item()}\n") in msg
    assert f"\ntilews: {out}\ntorch: {ref}" in msg


def test_torch_assert_close_attributes():
    a = randn(4, 8, seed=3)
    with pytest.raises(AssertionError, match=r"The values for attribute 'shape' do not match: "
                                             r"torch.Size\(\[4, 8\]\) != torch.Size\(\[8, 4\]\)."):
        torch_assert_close(a, a.t().contiguous())
    with pytest.raises(AssertionError, match="attribute 'dtype' do not match: torch.float32 != "
                                             "torch.float64"):
        torch_assert_close(a, a.double())
    assert torch_assert_close(a, a.double(), check_dtype=False)          # compared as float64
    assert torch_assert_close(a.t(), a.t().contiguous())                 # strides unchecked...
    with pytest.raises(AssertionError, match=r"'stride\(\)' do not match: \(1, 8\) != \(4, 1\)"):
        torch_assert_close(a.t(), a.t().contiguous(), check_stride=True)  # ...unless asked
    u = torch.randint(0, 1000, (16,), dtype=torch.int64)
    assert torch_assert_close(u.to(torch.uint32), u, check_dtype=False, rtol=0, atol=0)


def test_torch_assert_close_nan_and_verbose(capsys):
    a = randn(1000, seed=4)
    a[7] = float("nan")
    assert torch_assert_close(a, a.clone(), verbose=True)
    assert capsys.readouterr().out == "Number of mismatched elements: 0 / 1000 (allowed: 1)\n"
    b = a.clone()
    b[7] = 0.0
    assert torch_assert_close(a, b)                                      # 1 NaN allowed ...
    with pytest.raises(AssertionError, match="Too many mismatched elements: 1 > 0"):
        torch_assert_close(a, b, max_mismatched_ratio=0)                 # ... unless none is


# ----------------------------------------------------------------------------------------------
# tilews.utils.tensor.get_tensor_supply


@pytest.mark.parametrize("supply_type, dtype_, check", [
    (TensorSupplyType.Integer, T.float16, lambda t: set(t.unique().tolist()) <= {-2, -1, 0, 1, 2}),
    (TensorSupplyType.Auto, T.float32, lambda t: t.abs().max() <= 1 and len(t.unique()) > 100),
    (TensorSupplyType.Auto, T.uint8, lambda t: set(t.unique().tolist()) <= {0, 1, 2}),
    (TensorSupplyType.Randn, T.bfloat16, lambda t: t.abs().max() > 1 and len(t.unique()) > 50),
    (TensorSupplyType.One, T.int32, lambda t: bool((t == 1).all())),
    (TensorSupplyType.Zero, T.float16, lambda t: bool((t == 0).all())),
])
def test_get_tensor_supply(supply_type, dtype_, check):
    supply = get_tensor_supply(supply_type)
    t = supply(KernelParam("A", dtype_, (32, 16)))
    assert (t.shape, t.dtype, t.device) == ((32, 16), dtype_.torch_dtype, torch.device("cpu"))
    assert check(t.float())


def test_get_tensor_supply_defaults_to_integer_and_needs_a_static_shape():
    t = get_tensor_supply()(KernelParam("A", T.float32, (64,)))
    assert set(t.unique().tolist()) <= {-2, -1, 0, 1, 2}
    with pytest.raises(ValueError, match=r"parameter 'B' has no static shape \(\('M', 16\)\)"):
        get_tensor_supply(TensorSupplyType.Auto)(KernelParam("B", T.float16, ("M", 16)))


# ----------------------------------------------------------------------------------------------
# tilews.math, tilews.language.dtypes, tilews.DataType, set_random_seed


def test_math():
    assert [tilews.next_power_of_2(x) for x in (1, 2, 3, 5, 64, 65, 1000)] == [1, 2, 4, 8, 64, 128, 1024]
    assert [tilews.cdiv(a, 128) for a in (1, 127, 128, 129, 1000)] == [1, 1, 1, 2, 8]
    assert tilews.math.cdiv is tilews.cdiv


def test_dtypes_map():
    assert _TORCH_DTYPE_TO_STR[torch.float16] == "float16"
    assert _TORCH_DTYPE_TO_STR[torch.short] == "int16"
    assert _TORCH_DTYPE_TO_STR[torch.float8_e4m3fn] == "float8_e4m3fn"
    for torch_dtype, name in _TORCH_DTYPE_TO_STR.items():       # gemm_sp's _to_tl_dtype
        d = dtype(name)
        assert d == name and d.torch_dtype == torch_dtype
        assert d.bits == (1 if torch_dtype == torch.bool else torch_dtype.itemsize * 8)
    assert dtype is T.dtype and tilews.DataType("float16").bits == 16
    assert (determine_torch_fp8_type(), determine_torch_fp8_type("e5m2")) == (
        torch.float8_e4m3fn, torch.float8_e5m2)


def test_set_random_seed():
    def draw():
        return random.random(), np.random.rand(), torch.rand(3).tolist()
    tilews.testing.set_random_seed(7)
    first = draw()
    tilews.testing.set_random_seed(7)
    assert draw() == first
    tilews.testing.set_random_seed()
    assert draw() != first


# ----------------------------------------------------------------------------------------------
# tilews.compile, tilews.lower / tilews.engine.lower, tilews.JITKernel


def scale_add(M, N, block_M, dtype_="float16"):
    @T.prim_func
    def main(A: T.Tensor((M, N), dtype_), B: T.Tensor((M, N), dtype_), C: T.Tensor((M, N), dtype_)):
        with T.Kernel(T.ceildiv(M, block_M), threads=128) as bx:
            for i, j in T.Parallel(block_M, N):
                C[bx * block_M + i, j] = A[bx * block_M + i, j] * 2 + B[bx * block_M + i, j]
    return main


def test_compile_a_prim_func():
    kernel = tilews.compile(scale_add(100, 32, 64), out_idx=[2], target="interpret",
                            execution_backend="auto", pass_configs={"tl.disable_warp_specialized": True})
    assert isinstance(kernel, tilews.JITKernel)
    a, b = randn(100, 32, dtype=torch.float16, seed=5), randn(100, 32, dtype=torch.float16, seed=6)
    torch_assert_close(kernel(a, b).float(), a.float() * 2 + b.float(), rtol=1e-3, atol=1e-3,
                       max_mismatched_ratio=0)
    with pytest.raises(TypeError, match=r"tilews.compile\(\) takes a @T.prim_func; got function"):
        tilews.compile(scale_add)


@pytest.mark.parametrize("target, spelled", [("triton", "tl.store("), ("interpret", "kernel main(")])
def test_lower_compiles_without_running(target, spelled):
    art = tilews.engine.lower(scale_add(128, 64, 64), target=target)
    assert tilews.lower is tilews.engine.lower
    assert spelled in art.kernel_source and art.target == target
    assert [(p.name, p.dtype, p.shape) for p in art.params] == [
        (n, T.float16, (128, 64)) for n in ("A", "B", "C")]


def test_lower_runs_nothing():
    """Compiling for Hopper needs no GPU: the generated source comes back (here triton.language:
    the program has nothing to warp-specialize), no launch is attempted."""
    art = tilews.lower(scale_add(256, 64, 64), target="hopper")
    assert "import triton.language as tl" in art.kernel_source and art.target == "hopper -> triton"


def test_main_runs_pytest_on_the_calling_module(tmp_path):
    test_file = tmp_path / "test_calls_main.py"
    test_file.write_text(textwrap.dedent("""
        import tilews.testing as T2

        def test_passes():
            assert T2.main is not None

        def test_selected_out():
            raise AssertionError("deselected by -k on the command line")

        if __name__ == "__main__":
            T2.main()
    """))
    done = subprocess.run([sys.executable, str(test_file), "-k", "passes", "-p", "no:cacheprovider"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "1 passed, 1 deselected" in done.stdout


def test_target_cuda_is_the_machines_gpu_target_and_an_error_without_a_cuda_gpu(monkeypatch):
    from tilews import targets
    gpu(monkeypatch, (9, 0))
    assert targets.resolve("cuda")[0] == "hopper"
    gpu(monkeypatch, (8, 0))
    assert targets.resolve("cuda")[0] == "triton"
    gpu(monkeypatch, None)
    with pytest.raises(ValueError, match="target 'cuda' needs a CUDA GPU"):
        targets.resolve("cuda")


def test_tilelang_names_tilews_lacks_say_why_at_the_users_line():
    def f(N):
        @T.prim_func
        def main(A: T.Tensor((N,), T.float32)):
            with T.Kernel(1, threads=128):
                tx = T.get_thread_binding()  # <- error
                A[tx] = 0.0
        return main
    with pytest.raises(tilews.CompileError, match="T.get_thread_binding is TileLang's; tilews does "
                                                  "not provide it: the thread level") as info:
        tilews.jit(out_idx=[], target="interpret")(f)(128)
    assert info.value.loc.line == marked_line(f)
    with pytest.raises(T.unsupported.NotProvided, match="T.ptx_cp_async is TileLang's"):
        T.ptx_cp_async
    with pytest.raises(AttributeError, match="has no attribute 'no_such_name'"):
        T.no_such_name


def test_c_dtype_names_and_sub_byte_names():
    assert (T.int, T.uint, T.short, T.long, T.double) == (T.int32, T.uint32, T.int16, T.int64,
                                                          T.float64)
    assert T.int4 == "int4" and {T.int4: "i4"}[T.int4] == "i4"     # a name a program may hold

    def f(N):
        @T.prim_func
        def main(A: T.Tensor((N,), T.int4)):
            with T.Kernel(1, threads=128):
                A[0] = 0
        return main
    with pytest.raises(tilews.CompileError, match="'int4' has fewer than 8 bits"):
        tilews.jit(out_idx=[], target="interpret")(f)(16)


@pytest.mark.parametrize("module, name", [
    ("tilews.cuda.intrinsics.macro.mma_macro_generator", "TensorCoreIntrinEmitter"),
    ("tilews.cuda.intrinsics", "get_swizzle_layout"),
    ("tilews.rocm.target", "target_is_gfx950")])
def test_vendor_emitter_modules_import_and_their_names_say_they_are_not_provided(module, name):
    from tilews.unprovided import NotProvided
    stand_in = getattr(importlib.import_module(module), name)     # a program that only imports runs
    qualname = "tilelang" + module[len("tilews"):] + "." + name
    for use in (lambda: stand_in(1, k=2), lambda: stand_in.method, lambda: types.new_class("X", (stand_in,))):
        with pytest.raises(NotProvided, match=f"tilews does not provide TileLang's {qualname}: "):
            use()


def test_env_reports_and_switches_the_disk_cache(monkeypatch, tmp_path):
    import tilews.env
    monkeypatch.setenv("TILEWS_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("TILEWS_DISABLE_CACHE", "0")     # both restored after, whatever the test sets
    monkeypatch.setenv("TILELANG_DISABLE_CACHE", "1")
    assert tilews.env.TILELANG_CACHE_DIR.startswith(str(tmp_path))
    assert not tilews.env.env.is_cache_enabled()
    tilews.env.env.enable_cache()
    assert tilews.env.env.is_cache_enabled()
    tilews.env.env.disable_cache()
    assert not tilews.env.env.is_cache_enabled()
    from tilews.cache import DiskCache
    from tilews.lowering.settings import Settings
    assert DiskCache.from_settings(Settings.from_env()).disabled
