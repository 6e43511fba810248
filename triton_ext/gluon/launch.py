"""Compiling and launching emitted Gluon source.

At construction a ``GluonProgram`` compiles its source for ``GPUTarget("cuda", 90, 32)`` without a
GPU, in a child process (``compile.py``; Gluon cannot compile under ``TRITON_INTERPRET=1`` and some
invalid layouts abort the process), so ``.asm`` holds ``"gluon"``, ``"ttgir"``, ``"llir"`` and
``"ptx"`` on any Linux machine. The result is cached in the tilews disk cache, keyed by the
source, the parameters' shapes and dtypes, ``num_warps`` and the Triton version.

``.launch(args)`` needs a Hopper GPU: it loads the module (written like ``tl``'s, content-addressed
under the tilews cache dir), builds the kernel's arguments with the module's ``<kernel>_args``
(TMA descriptors; tensors and strides for pointer parameters) and launches the ``@gluon.jit``
kernel on ``<kernel>_grid`` with Triton's JIT, on the current torch stream. Triton is imported
only there.
"""
from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from tilews import cache
from tilews.lowering import arguments, ir
from tilews.lowering.errors import CompileError, InternalError

from ..tl.emit import GRID_SUFFIX
from ..tl.launch import source_path
from .emit import ARGS_SUFFIX

TARGET = ("cuda", 90, 32)
_COMPILE_SCRIPT = Path(__file__).with_name("compile.py")
_SCALAR_TYPES = {ir.DType.I32: "i32", ir.DType.I64: "i64", ir.DType.I16: "i16", ir.DType.I8: "i8",
                 ir.DType.U8: "u8", ir.DType.BOOL: "i1", ir.DType.F32: "fp32", ir.DType.F64: "fp64",
                 ir.DType.F16: "fp16", ir.DType.BF16: "bf16"}


def compile_only(source: str, fn_name: str, kernel: ir.Kernel) -> dict:
    """Triton's stages and metadata for ``source`` built for sm_90a (cached on disk)."""
    spec = {"fn": fn_name, "args_fn": fn_name + ARGS_SUFFIX, "num_warps": kernel.attr("num_warps"),
            "target": list(TARGET), "params": [_param_spec(p) for p in kernel.params]}
    try:
        version = importlib.metadata.version("triton")
    except importlib.metadata.PackageNotFoundError:
        raise InternalError("target 'hopper' needs Triton (pip install triton==3.6.0 on Linux)",
                            kernel.loc) from None
    from tilews.triton_ext import passes as ttgir_passes
    # the stage hook is not part of Triton's cache key: it is part of ours
    key = cache.cache_key("tilews-gluon-asm", 1, version, ttgir_passes.cache_key_part(), source,
                          json.dumps(spec, sort_keys=True))
    payload, _ = cache.DiskCache().get_or_build(key, lambda: _run_compile(source, spec, kernel))
    return json.loads(payload)


def _param_spec(p) -> dict:
    if isinstance(p, ir.Var):
        return {"kind": "scalar", "type": _SCALAR_TYPES[p.dtype]}
    return {"kind": "buffer", "shape": list(p.static_shape), "dtype": str(arguments.TORCH_DTYPES[p.dtype]).removeprefix("torch.")}


def _run_compile(source: str, spec: dict, kernel: ir.Kernel) -> bytes:
    path = source_path(source)
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    # the child imports what this process imports (tilews may be a checkout, not an install)
    env["PYTHONPATH"] = os.pathsep.join(os.path.abspath(p) if p else os.getcwd() for p in sys.path)
    with tempfile.TemporaryDirectory(prefix="tilews-gluon-") as tmp:
        spec_file, out_file = Path(tmp) / "spec.json", Path(tmp) / "out.json"
        spec_file.write_text(json.dumps({**spec, "source": str(path)}))
        proc = subprocess.run([sys.executable, str(_COMPILE_SCRIPT), str(spec_file), str(out_file)],
                              capture_output=True, text=True, env=env, timeout=900)
        if proc.returncode != 0 or not out_file.exists():
            how = (f"Triton aborted (signal {-proc.returncode})" if proc.returncode < 0
                   else f"exit status {proc.returncode}")
            tail = (proc.stderr or proc.stdout).strip().splitlines()[-25:]
            raise InternalError(f"gluon backend: compiling the generated source of "
                                f"'{kernel.name}' for sm_90a failed ({how}); source: {path}",
                                kernel.loc, tail)
        payload = out_file.read_bytes()
        finding = json.loads(payload)
        if "verifier_error" in finding:   # raised, so never cached
            raise CompileError(finding["verifier_error"], kernel.loc, finding["notes"])
        return payload


class GluonProgram:
    """An emitted Gluon kernel: compiled for sm_90a at construction, launched on a Hopper GPU."""

    def __init__(self, source: str, fn_name: str, kernel: ir.Kernel):
        self.source = source
        self.kernel = kernel
        self.fn_name = fn_name
        self.num_warps = kernel.attr("num_warps")
        built = compile_only(source, fn_name, kernel)
        self._stages: dict[str, str] = built["asm"]
        self.metadata: dict = built["metadata"]
        self._module = None

    @property
    def asm(self) -> dict[str, str]:
        """Stage name -> text: ``"gluon"`` (the emitted source) and Triton's stages."""
        return {"gluon": self.source, **self._stages}

    def launch(self, args: list) -> None:
        """Run the kernel; ``args`` align with ``kernel.params`` (tensors for buffers, ints for
        scalars), on the current torch stream."""
        values = arguments.check(self.kernel, args)
        _require_hopper()
        tma = {g for g, _ in self.kernel.attr("tma_descriptors", ())}
        for p, a in zip(self.kernel.params, args):
            if isinstance(p, ir.Buffer):
                _check_operand(p, a, p.name in tma)
        module = self._load()
        flat = getattr(module, self.fn_name + ARGS_SUFFIX)(*args)
        grid = getattr(module, self.fn_name + GRID_SUFFIX)(*(values[v] for v in self.kernel.scalar_params))
        getattr(module, self.fn_name)[grid](*flat, num_warps=self.num_warps)

    def _load(self):
        if self._module is None:
            path = source_path(self.source)
            spec = importlib.util.spec_from_file_location(f"tilews_gluon_{path.stem}", path)
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
            self._module = module
        return self._module


def _require_hopper() -> None:
    import torch
    if os.environ.get("TRITON_INTERPRET") == "1":
        raise RuntimeError("target 'hopper' cannot run under TRITON_INTERPRET=1 (Gluon kernels do "
                           "not run in Triton's interpreter); its compiled stages are in .asm")
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0):
        raise RuntimeError("target 'hopper' runs only on an sm_90 GPU (H100/H200); on this machine "
                           "it is compile-only: inspect .asm")


def _check_operand(p: ir.Buffer, a, tma: bool) -> None:
    """A CUDA tensor; for a TMA descriptor also 16-byte aligned base and strides, unit stride in
    the last dimension (a pointer parameter takes any strides)."""
    if a.device.type != "cuda":
        raise ValueError(f"argument '{p.name}' must be a CUDA tensor, got device {a.device}")
    if not tma:
        return
    item = a.element_size()
    if a.data_ptr() % 16 or a.stride()[-1] != 1 or any(s * item % 16 for s in a.stride()[:-1]):
        raise ValueError(f"argument '{p.name}' must have a 16-byte aligned address, unit stride in "
                         f"its last dimension and 16-byte aligned other strides (a bulk-copy "
                         f"operand); got strides {list(a.stride())}")
