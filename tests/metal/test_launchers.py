"""The two Metal launchers on Linux, where no Metal runs.

mlx (``tilews.metal.mlx_launch``): a launch traced in ``mx.export_function`` with ``verbose=True``
prints the exact kernel source mlx would compile; the tests check it against the ``MslKernel``:
our params (inputs in params order, then outputs) with their address spaces and mlx's spelling of
their types, the thread attributes the body uses, the header and the body verbatim. A kernel that
updates a param in place is refused. Skipped without mlx (``pip install "mlx[cpu]"``).

torch.mps (``tilews.metal.mps_launch``): ``torch.mps.compile_shader`` is replaced by a recorder and
the MPS device by the CPU; the tests check the compiled text (``full_source()``, compiled once),
the arguments in params order (the caller's tensors themselves: zero copy; scalars as numbers
with their ``arg_casts``) and the dispatch sizes in threads.
"""
from __future__ import annotations

import re

import pytest
import torch

from tilews.metal import mps_launch
from tilews.metal.source import ATTRIBUTES, MslKernel, MslParam


def _mlx():
    try:
        import mlx.core as mx
        return mx
    except (ImportError, OSError):   # plain `mlx` on Linux fails to load libmlx.so
        return None


mx = _mlx()
needs_mlx = pytest.mark.skipif(mx is None, reason='mlx is not installed (pip install "mlx[cpu]")')

# mlx's names of the MSL element types in the signatures it writes
MLX_SPELLING = {"float": "float", "half": "float16_t", "bfloat": "bfloat16_t", "int": "int32_t",
                "uint": "uint32_t", "uchar": "uint8_t", "char": "int8_t", "short": "int16_t",
                "ushort": "uint16_t", "long": "int64_t", "ulong": "uint64_t", "bool": "bool"}
# our address space -> mlx's for a param: written, read-only, scalar (fewer than 8 elements)
MLX_SPACE = {"device": "device", "const device": "const device", "constant": "const constant"}

THREADS = 64


def scale_kernel() -> MslKernel:
    """y[i] = x[i] * alpha[0] for i < n[0] (float)."""
    return MslKernel(
        name="scale", header="",
        body=(f"    uint i = threadgroup_position_in_grid.x * {THREADS} + thread_index_in_threadgroup;\n"
              "    if (i < uint(n[0])) y[i] = x[i] * alpha[0];\n"),
        params=(MslParam("x", "float", written=False), MslParam("alpha", "float", written=False, scalar=True),
                MslParam("n", "int", written=False, scalar=True),
                MslParam("y", "float", written=True, read=False)),
        attributes=("threadgroup_position_in_grid", "thread_index_in_threadgroup"), threads=THREADS)


def bf16_kernel() -> MslKernel:
    """out = bfloat(twice(a) * scale[0]) for one simdgroup per threadgroup; the output sits between
    the inputs in params order, and a helper function lives in the header."""
    return MslKernel(
        name="bf16_scale", header="inline float twice(float v) { return 2.0f * v; }\n",
        body=("    uint i = threadgroup_position_in_grid.x * 32 + thread_index_in_simdgroup;\n"
              "    out[i] = bfloat(twice(float(a[i])) * float(scale[0]));\n"),
        params=(MslParam("a", "bfloat", written=False), MslParam("out", "bfloat", written=True, read=False),
                MslParam("scale", "half", written=False, scalar=True)),
        attributes=("threadgroup_position_in_grid", "thread_index_in_simdgroup"), threads=32)


# ---- mlx ---------------------------------------------------------------------------------------------

def mlx_source(kernel: MslKernel, args, grid, capfd, tmp_path) -> str:
    """The source mlx generates for launching ``kernel`` with ``args`` (mx arrays are traced
    inputs), from ``verbose=True`` inside ``mx.export_function``."""
    from tilews.metal.mlx_launch import MlxLauncher
    launcher = MlxLauncher(kernel)
    arrays = [a for a in args if isinstance(a, mx.array)]

    def traced(*inputs):
        it = iter(inputs)
        return launcher([next(it) if isinstance(a, mx.array) else a for a in args], grid, verbose=True)
    capfd.readouterr()
    mx.export_function(str(tmp_path / "launch.mlxfn"), traced, *arrays)
    out = capfd.readouterr().out
    found = re.search(rf"Generated source code for `{kernel.name}`:\n```\n(.*)\n```", out, re.S)
    assert found, out
    return found.group(1)


def split_kernel(source: str) -> tuple[str, str, list[str], str]:
    """(text before the kernel, its name, its parameter declarations, its body)."""
    found = re.search(r"\[\[kernel\]\] void (\w+)\(\n(.*?)\) \{\n(.*)\}\s*$", source, re.S)
    assert found, source
    decls = [d.strip() for d in found.group(2).split(",\n")]
    return source[:found.start()], found.group(1), decls, found.group(3)


def expected_mlx_decls(kernel: MslKernel) -> list[str]:
    """Our signature (``full_source``) respelled as mlx writes it: inputs, then outputs,
    renumbered."""
    _, _, ours, _ = split_kernel(kernel.full_source())
    by_name = {}
    for decl in ours[:len(kernel.params)]:
        space, dtype, name = re.fullmatch(r"(const device|device|constant) (\w+)\* (\w+) \[\[buffer\(\d+\)\]\]",
                                          decl).groups()
        by_name[name] = (MLX_SPACE[space], MLX_SPELLING[dtype])
    order = [p for p in kernel.params if not p.written] + [p for p in kernel.params if p.written]
    return [f"{by_name[p.name][0]} {by_name[p.name][1]}* {p.name} [[buffer({i})]]" for i, p in enumerate(order)]


@needs_mlx
@pytest.mark.parametrize("make, args, grid", [
    (scale_kernel, lambda: [mx.zeros((100,), dtype=mx.float32), 0.5, 100, (100,)], (2, 1, 1)),
    (bf16_kernel, lambda: [mx.zeros((64,), dtype=mx.bfloat16), mx.zeros((64,), dtype=mx.bfloat16), 1.5],
     (2, 1, 1)),
])
def test_mlx_generates_our_signature_header_and_body(make, args, grid, capfd, tmp_path):
    kernel = make()
    source = mlx_source(kernel, args(), grid, capfd, tmp_path)
    before, name, decls, body = split_kernel(source)
    assert name.startswith(f"custom_kernel_{kernel.name}_")
    n = len(kernel.params)
    assert decls[:n] == expected_mlx_decls(kernel)
    assert sorted(decls[n:]) == sorted(f"{ATTRIBUTES[a]} {a} [[{a}]]" for a in kernel.attributes)
    assert body.rstrip("\n") == kernel.body.rstrip("\n")
    assert before.rstrip("\n") == kernel.header.rstrip("\n")


@needs_mlx
def test_mlx_spells_bfloat_half_and_scalars_its_way(capfd, tmp_path):
    """What the bf16 kernel's signature reads, literally: bfloat16_t (bfloat from Metal 3.1), the
    half scalar as a 1-element float16_t buffer in the constant address space."""
    kernel = bf16_kernel()
    source = mlx_source(kernel, [mx.zeros((64,), dtype=mx.bfloat16), (64,), 1.5], (2, 1, 1), capfd, tmp_path)
    _, _, decls, _ = split_kernel(source)
    assert decls[:3] == ["const device bfloat16_t* a [[buffer(0)]]",
                         "const constant float16_t* scale [[buffer(1)]]",
                         "device bfloat16_t* out [[buffer(2)]]"]


@needs_mlx
def test_mlx_kernel_is_built_once_and_launched_in_threads(monkeypatch):
    """What the launcher gives mlx: the parts and names once; per launch the inputs (scalars as
    1-element arrays of their dtype), the outputs' shapes and dtypes, the grid in threads."""
    from tilews.metal.mlx_launch import MlxLauncher
    built, launched = [], []

    def metal_kernel(**parts):
        built.append(parts)
        return lambda **launch: launched.append(launch) or ["result"]
    monkeypatch.setattr(mx.fast, "metal_kernel", metal_kernel)
    kernel = bf16_kernel()
    launcher = MlxLauncher(kernel)
    a = mx.zeros((96,), dtype=mx.bfloat16)
    assert launcher([a, (96,), 1.5], (3, 1, 1)) == ["result"]
    launcher([a, mx.zeros((96,), dtype=mx.bfloat16), 2.0], (3, 2, 1))
    assert built == [dict(name="bf16_scale", input_names=["a", "scale"], output_names=["out"],
                          source=kernel.body, header=kernel.header, ensure_row_contiguous=True)]
    first, second = launched
    assert first["inputs"][0] is a
    scale = first["inputs"][1]
    assert (scale.dtype, scale.shape, scale.item()) == (mx.float16, (1,), 1.5)
    assert (first["output_shapes"], first["output_dtypes"]) == ([(96,)], [mx.bfloat16])
    assert (first["grid"], first["threadgroup"]) == ((96, 1, 1), (32, 1, 1))
    assert (second["grid"], second["output_shapes"]) == ((96, 2, 1), [(96,)])


@needs_mlx
def test_mlx_refuses_a_kernel_that_updates_a_param_in_place():
    from tilews.metal.mlx_launch import MlxLauncher
    kernel = MslKernel("accumulate", "", "    c[0] += a[0];\n",
                       (MslParam("a", "float", written=False), MslParam("c", "float", written=True)),
                       (), 1)
    with pytest.raises(ValueError, match=r"kernel accumulate: parameter\(s\) c are written and also "
                                         r"read.*tilews\.metal\.mps_launch\.MpsLauncher on torch MPS"):
        MlxLauncher(kernel)


@needs_mlx
@pytest.mark.parametrize("args, grid, error, says", [
    (lambda: [mx.zeros((8,), dtype=mx.float16), 0.5, 8, (8,)], (1, 1, 1), TypeError,
     "kernel parameter 'x' is a float buffer (mlx.core.float32); got an mx.array of mlx.core.float16"),
    (lambda: [mx.zeros((8,)), 0.5, 2**31, (8,)], (1, 1, 1), ValueError,
     "kernel parameter 'n' is a int scalar: 2147483648 is outside [-2147483648, 2147483647]"),
    (lambda: [mx.zeros((8,)), 0.5, 2.5, (8,)], (1, 1, 1), ValueError,
     "kernel parameter 'n' is a int scalar: 2.5 is not an integer"),
    (lambda: [mx.zeros((8,)), 0.5, 8, "y"], (1, 1, 1), TypeError,
     "kernel parameter 'y' is an output: pass its shape (a tuple) or an mx.array"),
    (lambda: [mx.zeros((8,)), 0.5, 8], (1, 1, 1), TypeError, "kernel scale takes 4 arguments (x, alpha, n, y); got 3"),
    (lambda: [mx.zeros((8,)), 0.5, 8, (8,)], (1, 1), ValueError,
     "kernel scale: the grid is three positive threadgroup counts (gx, gy, gz); got (1, 1)"),
])
def test_mlx_launch_argument_errors_name_the_parameter(args, grid, error, says):
    from tilews.metal.mlx_launch import MlxLauncher
    with pytest.raises(error) as e:
        MlxLauncher(scale_kernel())(args(), grid)
    assert says in str(e.value)


# ---- torch.mps ---------------------------------------------------------------------------------------

class RecordingLibrary:
    """What ``torch.mps.compile_shader`` returns, recording each kernel call."""

    def __init__(self, source: str):
        self.source = source
        self.calls = []

    def __getattr__(self, name):
        return lambda *args, **kwargs: self.calls.append((name, args, kwargs))


@pytest.fixture
def compiled(monkeypatch) -> list[RecordingLibrary]:
    """Every library ``torch.mps.compile_shader`` built; CPU tensors stand in for MPS ones."""
    libraries = []

    def compile_shader(source: str) -> RecordingLibrary:
        libraries.append(RecordingLibrary(source))
        return libraries[-1]
    monkeypatch.setattr(torch.mps, "compile_shader", compile_shader)
    monkeypatch.setattr(mps_launch, "DEVICE_TYPE", "cpu")
    return libraries


def test_mps_compiles_the_full_source_once_and_launches_in_place(compiled):
    kernel = bf16_kernel()
    launcher = mps_launch.MpsLauncher(kernel)
    a = torch.randn(96, dtype=torch.bfloat16)
    out = torch.empty(96, dtype=torch.bfloat16)
    launcher([a, out, 1.5], (3, 1, 1))
    launcher([a, out, 2], (3, 2, 4))
    [library] = compiled
    assert library.source == kernel.full_source()
    (name, args, kwargs), (_, args2, kwargs2) = library.calls
    assert name == "bf16_scale"
    assert args[0] is a and args[1] is out and args[2] == 1.5        # zero copy: the caller's tensors
    assert type(args2[2]) is float and args2[2] == 2.0               # a half scalar goes as a float...
    assert kwargs == {"threads": [96, 1, 1], "group_size": [32, 1, 1], "arg_casts": {2: "fp16"}}  # ...cast
    assert kwargs2["threads"] == [96, 2, 4] and kwargs2["group_size"] == [32, 1, 1]


def test_mps_scalar_casts_follow_the_msl_type(compiled):
    launcher = mps_launch.MpsLauncher(scale_kernel())
    x, y = torch.randn(100), torch.empty(100)
    launcher([x, 0.25, 100, y], (2, 1, 1))
    _, args, kwargs = compiled[0].calls[0]
    assert args[1:3] == (0.25, 100) and type(args[2]) is int
    assert kwargs["arg_casts"] == {2: "int32"}                      # float needs none: 4-byte float
    long_kernel = MslKernel("k", "", "", (MslParam("n", "long", written=False, scalar=True),), (), 1)
    mps_launch.MpsLauncher(long_kernel)([3], (1, 1, 1))
    assert "arg_casts" not in compiled[1].calls[0][2]               # int64 is torch's default


def test_mps_takes_fp8_tensors_for_uchar_params_and_copies_strided_inputs(compiled):
    kernel = MslKernel("dec", "", "", (MslParam("codes", "uchar", written=False),
                                       MslParam("out", "half", written=True, read=False)), (), 32)
    codes = torch.arange(64, dtype=torch.uint8).view(torch.float8_e4m3fn).reshape(8, 8).t()
    out = torch.empty(64, dtype=torch.half)
    mps_launch.MpsLauncher(kernel)([codes, out], (2, 1, 1))
    passed = compiled[0].calls[0][1][0]
    assert passed.is_contiguous() and torch.equal(passed.view(torch.uint8), codes.view(torch.uint8))


@pytest.mark.parametrize("args, error, says", [
    (lambda: [torch.randn(64).bfloat16(), torch.empty(64, 2, dtype=torch.bfloat16)[:, 0], 1.0], ValueError,
     "kernel parameter 'out' is written in place, so its tensor must be contiguous (strides (2,) for shape (64,))"),
    (lambda: [torch.randn(64), torch.empty(64, dtype=torch.bfloat16), 1.0], TypeError,
     "kernel parameter 'a' is a bfloat buffer (torch.bfloat16); got a tensor of torch.float32"),
    (lambda: [torch.randn(64).bfloat16(), torch.empty(64, dtype=torch.bfloat16), "1"], TypeError,
     "kernel parameter 'scale' is a half scalar: pass a Python number, not str"),
    (lambda: [torch.randn(64).bfloat16().numpy, torch.empty(64, dtype=torch.bfloat16), 1.0], TypeError,
     "kernel parameter 'a': pass a torch tensor on the cpu device, not builtin_function_or_method"),
])
def test_mps_argument_errors_name_the_parameter(compiled, args, error, says):
    with pytest.raises(error) as e:
        mps_launch.MpsLauncher(bf16_kernel())(args(), (2, 1, 1))
    assert says in str(e.value)
    assert not compiled[0].calls


def test_mps_tensors_must_be_on_the_mps_device(compiled, monkeypatch):
    monkeypatch.setattr(mps_launch, "DEVICE_TYPE", "mps")
    a, out = torch.randn(64).bfloat16(), torch.empty(64, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="kernel parameter 'a': the tensor is on cpu; torch.mps "
                                         "kernels take tensors on the mps device"):
        mps_launch.MpsLauncher(bf16_kernel())([a, out, 1.0], (2, 1, 1))
