"""Compiling and launching emitted Gluon source.

At construction a ``GluonProgram`` compiles its source for ``GPUTarget("cuda", 90, 32)`` without a
GPU (``compile.build``), so ``.asm`` holds ``"gluon"``, ``"ttgir"``, ``"llir"`` and ``"ptx"`` on
any Linux machine. The result is kept in the artifact store, keyed by the source, the parameters'
shapes and dtypes, ``num_warps``, the Triton version and our TTGIR passes.

Where it compiles: in this process, unless ``TRITON_INTERPRET=1`` is set or was set when Triton
was imported (``_compiles_here``). Under the interpreter Gluon cannot compile here (Triton's
library is then made of interpreted functions, which Gluon's refuses), so a compile server child (``compile.py --serve``, one per process, started at the first such compile) builds
them: a fresh Python importing torch and triton costs seconds, paid once per process, not once
per kernel. A child that dies (Triton aborts on some invalid layouts) fails that compile with an
``InternalError`` carrying its error output, and the next compile starts a new one. Compiling in
this process costs no start-up, and on a GPU it is the compile that runs anyway: the first launch
of each specialization goes through Triton's JIT, which in this process, under the same checks
and Triton cache folder (``passes.checking``), finds this very build in Triton's cache (the
signature, attributes, constants and options ``compile.py`` gives match what the JIT computes for
contiguous, 16-byte aligned tensors), so a Gluon kernel is compiled once, not twice. The price: an
abort inside Triton (a tilews bug) ends this process instead of failing the compile with a
message. The tests run under ``TRITON_INTERPRET=1``, so the emitter's mistakes still meet the
child there.

``.launch(values)`` needs a Hopper GPU: the first call loads the module (``triton_ext.modules``)
and gives it a cache of TMA descriptors (``descriptors``); each call builds the kernel's arguments
with the module's ``<kernel>_args`` (TMA descriptors; tensors and strides for pointer parameters)
and launches the ``@gluon.jit`` kernel on ``<kernel>_grid`` through a ``triton_ext.launcher``
(Triton's JIT once per specialization, then the compiled kernel directly), on the current torch
stream, with programmatic dependent launch (``compile.OPTIONS``: the kernel may start while the
previous kernel in the stream finishes; ``emit``'s roles wait for it before touching global
memory). Its ``rules`` ask the binder for CUDA tensors and bulk-copy
alignment of the TMA operands. Triton is imported only there.

``.bound_launch()`` is the launch of a kept call (``Kernel.bound``: one call signature, so each
tensor's shape, strides and dtype are fixed): after its first call it passes Triton's C launcher
the arguments ``<kernel>_bound_args`` makes, each TMA descriptor expanded by a ``DescriptorSite``
(its encoded tensor map kept per tensor address), with the grid, stream and launch attributes
the general path would use: the host argument function's descriptor cache keys, Triton's
specialization of every argument and the descriptors' expansion are not paid per call. A call it
cannot take (a launch hook listening, another current device, a pointer's alignment or an
integer's class unlike the first call's) goes through ``.launch``.
"""
from __future__ import annotations

import functools
import json
import os
import select
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from typing import Callable, Optional

from tilews.lowering import ir
from tilews.lowering.arguments import ArgumentRules
from tilews.lowering.backend import ArtifactStore
from tilews.lowering.errors import CompileError, InternalError
from tilews.lowering.plans import AsyncPlan

from ..launcher import Launcher, bound_launch
from ..modules import load_module
from ..pysource import GRID_SUFFIX
from . import compile as gluon_compile
from .descriptors import DescriptorCache, DescriptorSite
from .emit import ARGS_SUFFIX, BOUND_ARGS_SUFFIX, DESCRIPTOR_FN, SITES_SUFFIX

TARGET = ("cuda", 90, 32)
_TIMEOUT_S = 900          # a build taking longer is taken for a hung child


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
    parts = ("tilews-gluon-asm", 3, triton_version, ttgir_passes.cache_key_part(), source,
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
    spec = {**spec, "source": str(path)}
    if not _compiles_here():
        payload = _SERVER.build(spec, kernel, path)
    else:
        try:
            payload = json.dumps(gluon_compile.build(spec)).encode()
        except Exception as e:   # Triton's own failure on our source: a tilews bug
            raise InternalError(f"gluon backend: compiling the generated source of '{kernel.name}' "
                                f"for sm_90a failed ({type(e).__name__}); source: {path}",
                                kernel.loc, str(e).strip().splitlines()[-150:]) from e
    finding = json.loads(payload)
    if "verifier_error" in finding:   # raised, so never cached
        raise CompileError(finding["verifier_error"], kernel.loc, finding["notes"])
    return payload


def _compiles_here() -> bool:
    """Whether Gluon compiles in this process: Triton's interpreter is off, and was off when
    Triton's library was imported (its ``@triton.jit`` functions are then interpreted ones, which
    Gluon's library refuses)."""
    if os.environ.get("TRITON_INTERPRET") == "1":
        return False
    from triton.language import standard
    from triton.runtime.jit import JITFunction
    return isinstance(standard.cdiv, JITFunction)


class CompileServer:
    """The compile child (``compile.py --serve``) of this process: started at the first build,
    kept for the next, replaced when it has died. One build at a time. A process forked from this
    one starts its own (``forget``): the parent's pipes are the parent's."""

    def __init__(self):
        self.forget()
        self.started = 0          # children started (tests)

    def forget(self) -> None:
        """No server yet (a forked process's state: its parent's server serves only its parent)."""
        self._lock = threading.Lock()
        self._proc: Optional[subprocess.Popen] = None
        self._log = None          # the child's stderr, a file (a pipe nobody reads would fill)

    def build(self, spec: dict, kernel: ir.Kernel, path: Path) -> bytes:
        """The JSON result of ``compile.build(spec)`` in the child, or an ``InternalError``
        carrying the child's error output if it failed or died."""
        env = _child_environment()
        with self._lock, tempfile.TemporaryDirectory(prefix="tilews-gluon-") as tmp:
            spec_file, out_file = Path(tmp) / "spec.json", Path(tmp) / "out.json"
            spec_file.write_text(json.dumps(spec))
            proc = self._running()
            self._log.seek(0, os.SEEK_END)
            start = self._log.tell()
            try:
                proc.stdin.write(json.dumps([str(spec_file), str(out_file), env]) + "\n")
                proc.stdin.flush()
                ready, _, _ = select.select([proc.stdout], [], [], _TIMEOUT_S)
                if not ready:
                    proc.kill()
                answered = bool(ready) and proc.stdout.readline() == "done\n"
            except BrokenPipeError:
                answered = False
            if answered and out_file.exists():
                return out_file.read_bytes()
            self._log.seek(start)
            tail = self._log.read().decode(errors="replace").strip().splitlines()[-150:]
            status = proc.wait()
            self._proc = None
            how = f"Triton aborted (signal {-status})" if status < 0 else f"exit status {status}"
            raise InternalError(f"gluon backend: compiling the generated source of "
                                f"'{kernel.name}' for sm_90a failed ({how}); source: {path}",
                                kernel.loc, tail)

    def _running(self) -> subprocess.Popen:
        if self._proc is not None and self._proc.poll() is None:
            return self._proc
        if self._log is None:
            self._log = tempfile.TemporaryFile(prefix="tilews-gluon-server-")
        env = _child_environment()
        # the child imports what this process imports (tilews may be a checkout, not an install)
        env["PYTHONPATH"] = os.pathsep.join(os.path.abspath(p) if p else os.getcwd() for p in sys.path)
        self._proc = subprocess.Popen([sys.executable, gluon_compile.__file__, "--serve"], env=env,
                                      stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                      stderr=self._log, text=True)
        self.started += 1
        return self._proc


def _child_environment() -> dict:
    """This process's environment without Triton's interpreter switch (the child compiles)."""
    return {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}


_SERVER = CompileServer()
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_SERVER.forget)


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
        self._host = None        # (argument function, grid function, Launcher, bound argument
                                 # function, descriptor sites) once loaded
        self._make_descriptor = None   # the module's own TensorDescriptor.from_tensor, once loaded

    @property
    def asm(self) -> dict[str, str]:
        """Stage name -> text: ``"gluon"`` (the emitted source) and Triton's stages."""
        return {"gluon": self.source, **self._stages}

    def launch(self, values: list) -> None:
        """Run the kernel on checked ``values`` aligned with ``kernel.params`` (tensors for
        buffers, numbers for scalars), on the current torch stream."""
        if self._host is None:
            self._host = self._load()
        args_fn, grid_fn, launcher = self._host[:3]
        launcher.launch(grid_fn(*[values[i] for i in self._scalar_at]), args_fn(*values))

    def bound_launch(self) -> Callable[[list], None]:
        """``launch`` for the values of one call signature (each tensor's shape, strides, dtype
        and device the same; the caller keys it on at least that, as ``Kernel.bound`` does):
        after a first ``launch``, straight to Triton's C launcher where it may
        (``launcher.bound_launch``), with the arguments ``<kernel>_bound_args`` expands (each
        TMA descriptor's tensor map encoded once per tensor address, ``DescriptorSite``)."""
        return bound_launch(lambda values: self.launch(values), self._direct)

    def _direct(self, values: list) -> Optional[Callable[[list], bool]]:
        """``Launcher.direct`` for ``bound_launch``, after ``values`` were launched; None where
        the compiled kernel's descriptors are not this module's sites."""
        args_fn, grid_fn, launcher, bound_args, site_specs = self._host
        scalar_at = self._scalar_at

        def preparer(compiled) -> Optional[Callable[[list], tuple]]:
            if len(compiled.descriptors) != len(site_specs):
                return None
            sites = tuple(DescriptorSite(self._make_descriptor, block, layout, compiled.encoder(i))
                          for i, (block, layout) in enumerate(site_specs))
            return lambda v: (grid_fn(*[v[i] for i in scalar_at]), bound_args(sites, *v))
        return launcher.direct(values, args_fn(*values), preparer)

    def _load(self):
        """The module's host functions and a launcher of its kernel (its JIT compiles under our
        checks, so it finds the build of ``compile_only`` in Triton's cache); TMA descriptors
        cached."""
        _require_hopper()
        from tilews.triton_ext import passes as ttgir_passes
        module = load_module(self.store, self.source, "tilews_gluon")
        self._make_descriptor = getattr(module, DESCRIPTOR_FN)
        setattr(module, DESCRIPTOR_FN, DescriptorCache(self._make_descriptor))
        name = self.kernel.name
        return (getattr(module, name + ARGS_SUFFIX), getattr(module, name + GRID_SUFFIX),
                Launcher(getattr(module, name), self.num_warps,
                         functools.partial(ttgir_passes.checking, self.kernel.fp8_promote_every),
                         gluon_compile.OPTIONS),
                getattr(module, name + BOUND_ARGS_SUFFIX), getattr(module, name + SITES_SUFFIX))


def _require_hopper() -> None:
    import torch
    if os.environ.get("TRITON_INTERPRET") == "1":
        raise RuntimeError("target 'hopper' cannot run under TRITON_INTERPRET=1 (Gluon kernels do "
                           "not run in Triton's interpreter); its compiled stages are in .asm")
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0):
        raise RuntimeError("target 'hopper' runs only on an sm_90 GPU (H100/H200); on this machine "
                           "it is compile-only: inspect .asm")
