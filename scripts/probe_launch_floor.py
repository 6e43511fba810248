"""Where a cached ``tilews.ops.matmul`` call's host time goes on a GPU machine, layer by layer down
to Triton's C launcher, beside ``torch.matmul`` (issue 41 item 6: the op within 3 us of torch).

Rows (bf16 64 x 64 x 64, the Hopper kernel ``ops.matmul`` picks; host microseconds per call of
``--calls`` back-to-back calls, the GPU's queue never full at these sizes; median of ``--rounds``
interleaved rounds, min..max):

* ``C launcher``: Triton's C launcher for the compiled kernel, called with the expanded arguments
  made once (TMA tensor maps included): the driver's launch and the launcher's argument parsing,
  the floor of any call through Triton;
* ``Launcher.launch``: tilews's launcher (device, stream, Triton's specialization, hooks, the
  descriptors' expansion) on arguments made once;
* ``GluonProgram.launch``: also the emitted host argument function (three TMA descriptor
  look-ups) and the grid function;
* ``bound_launch``: ``GluonProgram.bound_launch``'s launch of the same values (what a kept call
  launches with: straight to the C launcher, descriptors expanded per address);
* ``bound kernel``: the kept call's kernel call: the binding (alignment checks, ``torch.empty``
  of C), then ``bound_launch``;
* ``ops.matmul``: also the op's key and look-up;
* ``torch.matmul`` and ``torch.empty`` of the 64 x 64 output.

    python scripts/probe_launch_floor.py [--calls 2000] [--rounds 9] [--json PATH]
"""
from __future__ import annotations

import argparse
import importlib
import json
import statistics

import torch

from probe_fp8_host_time import per_call_us


def layers(a, b) -> dict:
    """The callables of each layer of a cached ``ops.matmul(a, b)`` (module docstring)."""
    mm = importlib.import_module("tilews.ops.matmul")     # tilews.ops.matmul is also the op
    mm.matmul(a, b)
    (runner,) = [r for r in mm._kernels.values()]
    (kernel,) = runner.kernels
    (compiled,) = kernel.kernels
    program = compiled.program
    values, _ = kernel.binder.bound((a, b))(a, b)       # the kernel's parameters' values, C made
    args_fn, grid_fn, launcher = program._host[:3]
    grid = grid_fn(*[values[i] for i in program._scalar_at])
    args = list(args_fn(*values))
    (direct,) = launcher.compiled.values()
    k = direct.kernel
    expanded = direct.expand(args)
    g = tuple(grid) + (1, 1)
    stream = torch.cuda.current_stream().cuda_stream
    bound = kernel.bound((a, b))
    bound_launch = program.bound_launch()
    bound_launch(values)

    def c_launcher():
        direct.raw(g[0], g[1], g[2], stream, k.function, direct.cooperative, direct.pdl, None, None,
                   k.packed_metadata, None, None, None, *expanded)
    return {"C launcher": c_launcher,
            "Launcher.launch": lambda: launcher.launch(grid, args),
            "GluonProgram.launch": lambda: program.launch(values),
            "bound_launch": lambda: bound_launch(values),
            "bound kernel": lambda: bound(a, b),
            "ops.matmul": lambda: mm.matmul(a, b),
            "torch.matmul": lambda: torch.matmul(a, b),
            "torch.empty": lambda: torch.empty((64, 64), dtype=a.dtype, device=a.device)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--json")
    args = ap.parse_args()
    a, b = (torch.randn(64, 64, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    rows = layers(a, b)
    want = a.double() @ b.double()
    got = rows["ops.matmul"]()
    err = float((got.double() - want).abs().max() / want.abs().max())
    assert err < 1e-2, f"ops.matmul: relative error {err:.2e}"
    for fn in rows.values():
        for _ in range(50):
            fn()
    us = {name: [] for name in rows}
    names = list(rows)
    for r in range(args.rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            us[name].append(per_call_us(rows[name], args.calls))
    result = {name: dict(us=statistics.median(v), lo=min(v), hi=max(v)) for name, v in us.items()}
    print(f"host us per call, {args.rounds} rounds of {args.calls} calls, {torch.cuda.get_device_name()}")
    for name, r in result.items():
        print(f"{name:<22} {r['us']:>7.2f}  ({r['lo']:.2f}..{r['hi']:.2f})")
    gap = [o - t for o, t in zip(us["ops.matmul"], us["torch.matmul"])]
    print(f"ops.matmul - torch.matmul: {statistics.median(gap):+.2f} us ({min(gap):+.2f}..{max(gap):+.2f})")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
