"""The Triton installed here: its version is part of both Triton backends' fingerprints (their
generated code and compiled stages depend on it), and the ptxas and cuobjdump it bundles report
on compiled kernels (spills, serialized wgmma, the SASS) without a GPU."""
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


def _bundled(*tools: str) -> Optional[list[str]]:
    """The paths of these tools as the installed Triton bundles them, or None if one is missing."""
    import triton
    folder = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")
    paths = [os.path.join(folder, tool) for tool in tools]
    return paths if all(os.path.exists(p) for p in paths) else None


def ptxas_report(ptx: str, arch: str = "sm_90a") -> Optional[str]:
    """What ``ptxas -v`` of Triton's bundled ptxas prints for ``ptx`` (registers, spill bytes,
    warnings such as C7514, serialized wgmma), or None when this Triton bundles no ptxas."""
    tools = _bundled("ptxas")
    if tools is None:
        return None
    with tempfile.TemporaryDirectory(prefix="tilews_ptxas_") as work:
        path = os.path.join(work, "kernel.ptx")
        with open(path, "w") as fh:
            fh.write(ptx)
        return subprocess.run([tools[0], "-v", "--gpu-name", arch, path, "-o", path + ".cubin"],
                              capture_output=True, text=True, check=True).stderr


def sass(ptx: str, arch: str = "sm_90a") -> Optional[str]:
    """``cuobjdump -sass`` of ``ptx`` assembled by Triton's bundled ptxas for ``arch`` (what the
    GPU runs, each instruction after its address), or None when this Triton bundles no ptxas or
    cuobjdump."""
    tools = _bundled("ptxas", "cuobjdump")
    if tools is None:
        return None
    ptxas, cuobjdump = tools
    with tempfile.TemporaryDirectory(prefix="tilews_sass_") as work:
        path = os.path.join(work, "kernel.ptx")
        with open(path, "w") as fh:
            fh.write(ptx)
        subprocess.run([ptxas, "--gpu-name", arch, path, "-o", path + ".cubin"], check=True,
                       capture_output=True)
        return subprocess.run([cuobjdump, "-sass", path + ".cubin"], check=True,
                              capture_output=True, text=True).stdout
