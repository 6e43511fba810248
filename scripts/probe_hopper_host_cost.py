"""Probe: the host cost of the ops' kept calls down the Hopper (Gluon) launch path, on any machine,
the GPU stubbed: Hopper kernels compiled compile-only, called with CPU tensors, Triton's driver
answering device 0 and stream 0, its first JIT launch replaced by a stand-in compiled kernel whose
C launcher is a no-op (TMA descriptors "encoded" once each, as the real wrapper does). What is
timed is every Python step of a call above Triton's C launcher: the op's key and lookup, its
argument mapping, the binding, the Gluon host argument function (TMA descriptor cache), the
launcher's specialization and the launch call. Not timed: CUDA's own costs (``torch.empty`` on
the caching allocator, the C launcher, the driver).

Rows (thread CPU time, best of 5 rounds of 10,000 calls, microseconds per call):
``decode`` (``decode_attention`` B1 H32/8 S8192 D128 bf16 ragged, 16 fused splits: the GPU
blocks and split count) and its parts; ``ops.matmul`` 64x64x64 bf16; ``fp8_scaled_mm`` with b
column-major (``w.t()``) and the tiling the op picks on an H100/H200 (132 SMs): per-tensor
scales at 16x4096x4096 (swapped, C^T = B A^T), per-row / per-column ones at 64x4096x4096 and at
``tilews-bench launch``'s 64x64x64. Run it under two checkouts to compare (each with its own
installed tilews: ``pip install -e``; run the script by its path from outside the checkout, so
each imports its own).

    python scripts/probe_hopper_host_cost.py [label]
"""
from __future__ import annotations

import dataclasses
import importlib
import sys
import time
import types

import torch

import tilews.triton_ext.gluon.launch as gluon_launch
import tilews.triton_ext.launcher as launcher_module

ROUNDS, CALLS = 5, 10000


def _no_launch(*args) -> None:       # Triton's C launcher, stubbed
    pass


class _StandIn:
    """What Triton's JIT returns at a first launch, as ``DirectLaunch.of`` reads it."""

    def __init__(self, descriptors: list[int]):
        self.function, self.packed_metadata = 1, (4, 1, 1, 1)
        launcher, tensordesc_indices, tensordesc_meta = _no_launch, set(descriptors), [{}] * len(descriptors)

        def wrapper(*args):          # Triton 3.6's descriptor wrapper, by its closure's names
            return launcher, tensordesc_indices, tensordesc_meta
        self.run = types.SimpleNamespace(global_scratch_size=0, profile_scratch_size=0,
                                         launch=wrapper if descriptors else _no_launch,
                                         launch_cooperative_grid=False, launch_pdl=False)


class _Jit:
    def __getitem__(self, grid):
        def first(*args, num_warps, **options):
            from triton.experimental.gluon.nvidia.hopper import TensorDescriptor
            return _StandIn([i for i, a in enumerate(args) if isinstance(a, TensorDescriptor)])
        return first


class _Driver:
    def get_current_device(self) -> int:
        return 0

    def get_current_stream(self, device: int) -> int:
        return 0


def stub_gpu() -> None:
    import triton.backends.nvidia.driver as nvidia
    gluon_launch._require_hopper = lambda: None
    launcher_module._THREAD.has_context = True
    init = launcher_module.Launcher.__init__

    def stubbed(self, fn, num_warps, compiling=None, options=None):
        init(self, fn, num_warps, options=options)
        self.fn, self.interpreted = _Jit(), False
        self._driver = types.SimpleNamespace(active=_Driver())
    launcher_module.Launcher.__init__ = stubbed
    nvidia.make_tensordesc_arg = lambda desc, meta: [object(), *desc.shape, *desc.strides]


def on_cpu(kernel):
    """A Hopper kernel that takes CPU tensors (its binder's device rule dropped)."""
    kernel.binder.checker.rules = dataclasses.replace(kernel.binder.checker.rules, device=None)
    return kernel


def per_call_us(fn) -> float:
    for _ in range(CALLS // 10):
        fn()
    best = float("inf")
    for _ in range(ROUNDS):
        t0 = time.thread_time()
        for _ in range(CALLS):
            fn()
        best = min(best, (time.thread_time() - t0) / CALLS * 1e6)
    return round(best, 2)


def decode_rows() -> dict:
    dec = importlib.import_module("tilews.ops.decode")
    blocks, jit = dec.blocks, dec._jit
    dec.blocks = lambda dim, gpu: blocks(dim, True)
    dec._within = lambda *a: None                       # a GPU call trusts its lengths
    dec._splits = lambda n, tiles, keys, block_N, gpu, op: dec.choose_num_splits(tiles, keys, block_N, 132)
    dec._jit = lambda program, target: lambda *a, **k: on_cpu(jit(program, target)(*a, **k))
    g = torch.Generator().manual_seed(0)
    q = torch.randn(1, 1, 32, 128, generator=g).bfloat16()
    k, v = (torch.randn(1, 8192, 8, 128, generator=g).bfloat16() for _ in range(2))
    lengths = torch.full((1,), 8192, dtype=torch.int32)
    tensors = (q, k, v, lengths, None)
    op = lambda: dec.decode_attention(q, k, v, lengths, target="hopper")   # noqa: E731
    op()
    (kept,) = dec._calls.values()
    cells = dict(zip(kept.__code__.co_freevars, (c.cell_contents for c in kept.__closure__)))
    run, arguments = cells["run"], cells["arguments"]
    args = arguments(*tensors)
    return {"decode": per_call_us(op), "decode kept call": per_call_us(lambda: kept(*tensors)),
            "decode kernel's bound call": per_call_us(lambda: run(*args))}


def matmul_rows() -> dict:
    mm = importlib.import_module("tilews.ops.matmul")
    program, build = mm._program, mm._build
    mm._program = lambda name, target, registers=False: program(
        name, "hopper" if target == "auto" else target, registers)

    def built(s, N, K, dtype, out, device_type, precision):
        runner = build(s, N, K, dtype, out, "cuda", precision)
        for kernel in runner.kernels:
            on_cpu(kernel)
        return runner
    mm._build = built
    a, b = (torch.randn(64, 64).bfloat16() for _ in range(2))
    mm.matmul(a, b)
    return {"ops.matmul 64^3": per_call_us(lambda: mm.matmul(a, b)),
            "torch.empty 64x64": per_call_us(lambda: torch.empty((64, 64), dtype=a.dtype, device=a.device))}


def fp8_rows() -> dict:
    """The op's kernels compiled for Hopper, taking CPU tensors; its tiling the default one on a
    CUDA device of 132 SMs."""
    fp8 = importlib.import_module("tilews.ops.fp8")
    jit = fp8.scaled_mm_kernel
    jit.target = "hopper"

    def kernels(*args, **kwargs):
        return on_cpu(jit(*args, **kwargs))
    kernels.target = jit.target
    fp8.scaled_mm_kernel = kernels
    fp8.tilews.num_sms = lambda *a: 132
    fp8._tiles_for = lambda args, a, b, sa, sb, bias, out, fast: fp8.default_tiles(
        args, torch.device("cuda"), bias is not None)
    g = torch.Generator().manual_seed(0)
    rows = {}
    for name, M, N, K, per_row in (("fp8 tensorwise 16x4096x4096 (swapped)", 16, 4096, 4096, False),
                                   ("fp8 rowwise 64x4096x4096", 64, 4096, 4096, True),
                                   ("fp8 rowwise 64^3 (launch bench)", 64, 64, 64, True)):
        a = torch.randn(M, K, generator=g).to(torch.float8_e4m3fn)
        b = torch.randn(N, K, generator=g).to(torch.float8_e4m3fn).t()
        sa, sb = (torch.rand(M, 1) + 0.5, torch.rand(1, N) + 0.5) if per_row else \
            (torch.tensor(0.5), torch.tensor(2.0))
        fp8.fp8_scaled_mm(a, b, sa, sb)
        rows[name] = per_call_us(lambda: fp8.fp8_scaled_mm(a, b, sa, sb))
    return rows


def main() -> None:
    stub_gpu()
    label = sys.argv[1] if len(sys.argv) > 1 else ""
    print(label, {**decode_rows(), **matmul_rows(), **fp8_rows()})


if __name__ == "__main__":
    main()
