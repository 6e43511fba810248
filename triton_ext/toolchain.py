"""The Triton installed here: its version is part of both Triton backends' fingerprints (their
generated code and compiled stages depend on it), and the ptxas it bundles reports on compiled
kernels (spills, serialized wgmma) without a GPU."""
from __future__ import annotations

import functools
import importlib.metadata
import os
import subprocess
import tempfile
from typing import Optional


@functools.lru_cache(maxsize=None)
def triton_version() -> str:
    """The installed Triton's version, or "absent"."""
    try:
        return importlib.metadata.version("triton")
    except importlib.metadata.PackageNotFoundError:
        return "absent"


def ptxas_report(ptx: str, arch: str = "sm_90a") -> Optional[str]:
    """What ``ptxas -v`` of Triton's bundled ptxas prints for ``ptx`` (registers, spill bytes,
    warnings such as C7514, serialized wgmma), or None when this Triton bundles no ptxas."""
    import triton
    ptxas = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "ptxas")
    if not os.path.exists(ptxas):
        return None
    with tempfile.TemporaryDirectory(prefix="tilews_ptxas_") as work:
        path = os.path.join(work, "kernel.ptx")
        with open(path, "w") as fh:
            fh.write(ptx)
        return subprocess.run([ptxas, "-v", "--gpu-name", arch, path, "-o", path + ".cubin"],
                              capture_output=True, text=True, check=True).stderr
