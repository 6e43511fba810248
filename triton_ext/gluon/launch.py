"""Compiling and launching emitted Gluon source.

At construction a ``GluonProgram`` compiles its source for ``GPUTarget("cuda", 90, 32)`` without a
GPU, in a child process (``compile.py``; Gluon cannot compile under ``TRITON_INTERPRET=1`` and some
invalid layouts abort the process), so ``.asm`` holds ``"gluon"``, ``"ttgir"``, ``"llir"`` and
``"ptx"`` on any Linux machine. The result is kept in the artifact store, keyed by the source, the
parameters' shapes and dtypes, ``num_warps``, the Triton version and our TTGIR passes.

``.launch(values)`` needs a Hopper GPU: the first call loads the module (``triton_ext.modules``)
and gives it a cache of TMA descriptors (``descriptors``); each call builds the kernel's arguments
with the module's ``<kernel>_args`` (TMA descriptors; tensors and strides for pointer parameters)
and launches the ``@gluon.jit`` kernel on ``<kernel>_grid`` through a ``triton_ext.launcher``
(Triton's JIT once per specialization, then the compiled kernel directly), on the current torch
stream. Its ``rules`` ask the binder for CUDA tensors and bulk-copy
alignment of the TMA operands. Triton is imported only there.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from tilews.lowering import ir
from tilews.lowering.arguments import ArgumentRules
from tilews.lowering.backend import ArtifactStore
from tilews.lowering.errors import CompileError, InternalError
from tilews.lowering.plans import AsyncPlan

from ..launcher import Launcher
from ..modules import load_module
from ..pysource import GRID_SUFFIX
from .descriptors import DescriptorCache
from .emit import ARGS_SUFFIX, DESCRIPTOR_FN

TARGET = ("cuda", 90, 32)
_COMPILE_SCRIPT = Path(__file__).with_name("compile.py")


def compile_only(source: str, kernel: ir.Kernel, store: ArtifactStore, triton_version: str) -> dict:
    """Triton's stages and metadata for ``source`` built for sm_90a (kept in the store)."""
    spec = {"fn": kernel.name, "args_fn": kernel.name + ARGS_SUFFIX,
            "num_warps": kernel.plan(AsyncPlan).num_warps,
            "target": list(TARGET), "params": [_param_spec(p) for p in kernel.params],
            "fp8_promote_every": kernel.fp8_promote_every}
    if triton_version == "absent":
        # the machine's setup, not a bug: the program cannot be compiled here
        raise CompileError("target 'hopper' needs Triton (pip install triton==3.6.0 on Linux)",
                           kernel.loc)
    from tilews.triton_ext import passes as ttgir_passes
    # the stage hook is not part of Triton's cache key: it is part of ours
    parts = ("tilews-gluon-asm", 2, triton_version, ttgir_passes.cache_key_part(), source,
             json.dumps(spec, sort_keys=True))
    payload, _ = store.fetch(parts, lambda: _run_compile(source, spec, kernel, store))
    return json.loads(payload)


def _param_spec(p) -> dict:
    if isinstance(p, ir.Var):
        return {"kind": "scalar", "type": p.dtype.record.signature}
    # a runtime dim (only a leading one reaches a TMA descriptor) compiles with a stand-in size:
    # a descriptor's type depends on its block and layout, never on the tensor's shape
    shape = [ir.as_int(d) if ir.as_int(d) is not None else 1 for d in p.shape]
    return {"kind": "buffer", "shape": shape, "dtype": p.dtype.record.torch}


def _run_compile(source: str, spec: dict, kernel: ir.Kernel, store: ArtifactStore) -> bytes:
    path = store.source_file(source)
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
            tail = (proc.stderr or proc.stdout).strip().splitlines()[-150:]
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

    def __init__(self, source: str, kernel: ir.Kernel, store: ArtifactStore, triton_version: str):
        self.source = source
        self.kernel = kernel
        self.store = store
        plan = kernel.plan(AsyncPlan)
        self.num_warps = plan.num_warps
        self.rules = ArgumentRules(device="cuda", bulk_copy=plan.tma_buffers)
        built = compile_only(source, kernel, store, triton_version)
        self._stages: dict[str, str] = built["asm"]
        self.metadata: dict = built["metadata"]
        self._scalar_at = [i for i, p in enumerate(kernel.params) if isinstance(p, ir.Var)]
        self._host = None        # (argument function, grid function, Launcher) once loaded

    @property
    def asm(self) -> dict[str, str]:
        """Stage name -> text: ``"gluon"`` (the emitted source) and Triton's stages."""
        return {"gluon": self.source, **self._stages}

    def launch(self, values: list) -> None:
        """Run the kernel on checked ``values`` aligned with ``kernel.params`` (tensors for
        buffers, numbers for scalars), on the current torch stream."""
        if self._host is None:
            self._host = self._load()
        args_fn, grid_fn, launcher = self._host
        launcher.launch(grid_fn(*[values[i] for i in self._scalar_at]), args_fn(*values))

    def _load(self):
        """The module's host functions and a launcher of its kernel; TMA descriptors cached."""
        _require_hopper()
        module = load_module(self.store, self.source, "tilews_gluon")
        setattr(module, DESCRIPTOR_FN, DescriptorCache(getattr(module, DESCRIPTOR_FN)))
        name = self.kernel.name
        return (getattr(module, name + ARGS_SUFFIX), getattr(module, name + GRID_SUFFIX),
                Launcher(getattr(module, name), self.num_warps))


def _require_hopper() -> None:
    import torch
    if os.environ.get("TRITON_INTERPRET") == "1":
        raise RuntimeError("target 'hopper' cannot run under TRITON_INTERPRET=1 (Gluon kernels do "
                           "not run in Triton's interpreter); its compiled stages are in .asm")
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0):
        raise RuntimeError("target 'hopper' runs only on an sm_90 GPU (H100/H200); on this machine "
                           "it is compile-only: inspect .asm")
