"""Loading and launching emitted ``triton.language`` source.

Triton reads a kernel's source with ``inspect``, so the source is written to a real file,
``<tilews cache dir>/tl/<sha256>.py`` (content-addressed, written atomically), imported under a
unique module name and wrapped with ``triton.jit``. Triton is imported here lazily: importing
tilews works where Triton is absent.

Triton's CPU interpreter must be chosen before ``triton`` is first imported (its standard library
is created as jitted functions at import); ``ensure_interpreter`` does that or says why it cannot.
"""
from __future__ import annotations

import hashlib
import importlib.util
import os
import sys
import tempfile
from pathlib import Path

from tilews.cache import default_cache_dir
from tilews.lowering import arguments, ir

from .emit import GRID_SUFFIX


def ensure_interpreter() -> None:
    """Make Triton run kernels with its CPU interpreter (``TRITON_INTERPRET=1``)."""
    if "triton" not in sys.modules:
        os.environ["TRITON_INTERPRET"] = "1"
        return
    import triton.language as tl
    from triton.runtime.interpreter import InterpretedFunction
    if not isinstance(tl.zeros, InterpretedFunction):
        raise RuntimeError("Triton was imported without its interpreter, and it cannot be switched on "
                           "afterwards; set TRITON_INTERPRET=1 in the environment before anything "
                           "imports triton (or call tilews.triton_ext.tl.ensure_interpreter() first)")


def source_path(source: str) -> Path:
    """The file holding ``source`` (written if missing)."""
    digest = hashlib.sha256(source.encode()).hexdigest()
    path = default_cache_dir() / "tl" / f"{digest}.py"
    if path.exists() and path.read_text() == source:
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{digest[:16]}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(source)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


class TlProgram:
    """An emitted kernel, loaded and ready to launch."""

    def __init__(self, source: str, fn_name: str, kernel: ir.Kernel, interpreter: bool):
        if interpreter:
            ensure_interpreter()
        import triton
        path = source_path(source)
        spec = importlib.util.spec_from_file_location(f"tilews_tl_{path.stem}", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        self.source = source
        self.kernel = kernel
        self.fn = triton.jit(getattr(module, fn_name))
        self.grid_fn = getattr(module, fn_name + GRID_SUFFIX)
        self.num_warps = kernel.attr("num_warps")
        self._compiled = None

    @property
    def asm(self) -> dict[str, str]:
        """Stage name -> text: ``"tl"`` (the emitted source), and Triton's stages (``"ttir"``,
        ``"ttgir"``, ``"ptx"``, ...) once Triton has compiled the kernel for a GPU."""
        stages = getattr(self._compiled, "asm", None) or {}
        return {"tl": self.source, **{k: v for k, v in stages.items() if isinstance(v, str)}}

    def launch(self, args: list) -> None:
        """Run the kernel; ``args`` align with ``kernel.params`` (tensors for buffers, ints for
        scalars), on the current torch stream."""
        scalars = arguments.check(self.kernel, args)
        flat = []
        for p, a in zip(self.kernel.params, args):
            if isinstance(p, ir.Buffer):
                flat += [a, *a.stride()]
            else:
                flat.append(float(a) if p.dtype.is_float else a)
        grid = self.grid_fn(*(scalars[v] for v in self.kernel.scalar_params))
        options = {} if self.num_warps is None else {"num_warps": self.num_warps}
        self._compiled = self.fn[grid](*flat, **options)
