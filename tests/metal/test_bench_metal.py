"""``tilews-bench gemm --target metal`` (issue 14): the target parses; mlx.core.matmul and torch.mm
on MPS join the run as its baselines (only with the metal target), each unavailable with its reason
off a Mac; the CUDA-sized tilews variants are unavailable on metal and the Metal-sized one runs on
the CPU harness there; on a Mac, tilews's metal kernels get MPS copies of the bench's tensors.

The Mac-only paths run here on stand-ins: mlx's matmul on mlx's CPU device (``mlx[cpu]``) and the
MPS helpers with the CPU as their device.
"""
from __future__ import annotations

import dataclasses
import json

import pytest
import torch

from tilews.bench import apple_gpu, cli, gemm, machine, runner
from tilews.bench.workload import Case, Variant

CUDA_SIZED = gemm.WORKLOAD.variants[0]                       # examples.gemm.matmul, 128x128x64
METAL_SIZED = next(v for v in gemm.WORKLOAD.variants if v.name == "tilews 64x64x32 s2")
HERE = machine.detect()
ON_A_MAC = machine.mps_unavailable(HERE) is None
MLX_REASONS = ("mlx has no Metal device here: it needs a Mac with an Apple GPU", "mlx is not importable here (")
MPS_REASON = "torch has no MPS device here: it needs a Mac with an Apple GPU"


def _mlx():
    try:
        import mlx.core as mx
        return mx
    except (ImportError, OSError):
        return None


@pytest.mark.parametrize("argv", [["--target", "metal"], ["--targets", "metal"], ["--targets", "interpret,metal"]])
def test_metal_is_a_target(argv):
    args = cli.build_parser().parse_args(["gemm", *argv])
    assert args.targets == argv[1].split(",")


def test_an_unknown_target_names_metal_among_the_targets(capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(["gemm", "--target", "mps"])
    assert e.value.code == 2
    assert "'mps': targets are a comma list of hopper, triton, interpret, metal" in capsys.readouterr().err


def test_apple_baselines_join_only_runs_with_the_metal_target():
    _, unavailable = runner.plan(gemm.WORKLOAD, ["interpret"], HERE)
    assert not any("mlx" in k or "MPS" in k for k in unavailable)
    impls, unavailable = runner.plan(gemm.WORKLOAD, ["metal"], HERE)
    names = {i.name for i in impls} | {k.removeprefix("reference ") for k in unavailable}
    assert {"mlx.core.matmul", "torch.mm (MPS)"} <= names
    assert unavailable[f"{CUDA_SIZED.name} on target metal"] == (
        "sized for a CUDA GPU: its tiles need more than Metal's 32 KB of threadgroup memory (target "
        "metal runs the Metal-sized variant)")
    assert METAL_SIZED.unavailable("interpret", HERE) == ("sized for Metal's 32 KB of threadgroup "
                                                          "memory: target metal only")
    assert METAL_SIZED.name in {i.name for i in impls if i.target == "metal"}


@pytest.mark.skipif(ON_A_MAC, reason="the reasons given off a Mac")
def test_off_a_mac_the_json_says_why_each_apple_baseline_cannot_run(tmp_path, capsys, monkeypatch):
    """The whole run: the Metal-sized tilews row runs on the CPU harness (an interpreted timing),
    torch.matmul on the CPU, and the two Apple baselines are unavailable with their reasons."""
    monkeypatch.setattr(gemm.WORKLOAD, "variants", [CUDA_SIZED, METAL_SIZED])
    monkeypatch.setattr(gemm.WORKLOAD, "references", [gemm.TORCH, gemm.MLX, gemm.MPS])
    path = tmp_path / "metal.json"
    code = cli.main(["gemm", "--target", "metal", "--shapes", "64x64x64", "--quick", "--rounds", "1",
                     "--json", str(path)])
    out = capsys.readouterr().out
    data = json.loads(path.read_text())
    assert data["targets"] == ["metal"] and "mlx" in data["versions"]
    assert data["unavailable"]["reference torch.mm (MPS)"] == MPS_REASON
    assert data["unavailable"]["reference mlx.core.matmul"].startswith(MLX_REASONS)
    assert f"reference torch.mm (MPS): unavailable ({MPS_REASON})" in out
    rows = {r["impl"]: r for r in data["rows"]}
    assert set(rows) == {METAL_SIZED.name, "torch.matmul"}
    tilews_row = rows[METAL_SIZED.name]
    assert (tilews_row["target"], tilews_row["interpreted"]) == ("metal", True)
    assert tilews_row["status"] == "ok", tilews_row["message"]
    assert tilews_row["rel_err"] < 1e-2 and code == 0


def test_on_a_mac_tilews_metal_kernels_get_mps_copies(monkeypatch):
    """Where torch has an MPS device, a metal variant is built wrapped by apple_gpu.on_mps and its
    timing is not an interpreter's (the CPU stands in for the MPS device here)."""
    monkeypatch.setattr(runner, "mps_unavailable", lambda m: None)
    monkeypatch.setattr(apple_gpu, "DEVICE", "cpu")
    seen = []

    def kernel(a, b, out):
        seen.append((a, b, out))
        out.copy_(a @ b)
    kernel.note = "schedule X"
    variant = Variant("planted", lambda case, target: kernel)
    [impl], _ = runner.plan(dataclasses.replace(gemm.WORKLOAD, variants=[variant], references=[]),
                            ["metal"], HERE)
    assert (impl.target, impl.interpreted) == ("metal", False)
    fn = impl.build(Case((8, 8, 8), torch.float32, HERE))
    a, b, out = torch.randn(8, 8), torch.randn(8, 8), torch.full((8, 8), float("nan"))
    result = fn(a, b, out)
    fn(a, b, out)
    torch.testing.assert_close(result, a @ b)
    assert fn.note == "schedule X"
    assert len(seen) == 2 and all(s[2] is seen[0][2] for s in seen)   # one device copy per tensor


def test_device_copies_convert_each_tensor_once():
    made = []
    copies = apple_gpu.DeviceCopies(lambda t: made.append(t) or t * 2)
    a, b = torch.ones(2), torch.ones(3)
    assert torch.equal(copies(a), 2 * a) and copies(a) is copies(a) and copies(b).shape == (3,)
    assert len(made) == 2


def test_mps_mm_returns_the_product_on_the_cpu(monkeypatch):
    monkeypatch.setattr(apple_gpu, "DEVICE", "cpu")
    a, b = torch.randn(16, 8, dtype=torch.bfloat16), torch.randn(8, 4, dtype=torch.bfloat16)
    got = apple_gpu.mps_mm(Case((16, 4, 8), torch.bfloat16, HERE))(a, b, torch.empty(16, 4, dtype=torch.bfloat16))
    assert got.device.type == "cpu"
    torch.testing.assert_close(got, torch.mm(a, b))


@pytest.mark.skipif(_mlx() is None, reason='mlx is not installed (pip install "mlx[cpu]")')
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_mlx_matmul_returns_the_product_as_a_torch_tensor(dtype):
    """On mlx's default device (the CPU under mlx[cpu]): the product, in the case's dtype."""
    gen = torch.Generator().manual_seed(0)
    a, b = torch.randn(40, 24, generator=gen).to(dtype), torch.randn(24, 56, generator=gen).to(dtype)
    fn = apple_gpu.mlx_matmul(Case((40, 56, 24), dtype, HERE))
    got = fn(a, b, torch.empty(40, 56, dtype=dtype))
    assert got.dtype == dtype and got.shape == (40, 56)
    exact = a.double() @ b.double()
    assert ((got.double() - exact).norm() / exact.norm()).item() < 1e-2
    assert torch.equal(fn(a, b, None), got)


def test_reasons_off_a_mac():
    if ON_A_MAC:
        pytest.skip("on a Mac torch has an MPS device")
    assert machine.mps_unavailable(HERE) == MPS_REASON
    assert machine.mlx_unavailable(HERE).startswith(MLX_REASONS)
    assert runner._interpreted("metal", HERE) is True
