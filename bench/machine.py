"""What the bench runs on: the device, its L2 size, the versions of everything that matters, and
whether Triton can run here (on a CPU: only under its interpreter, chosen before triton's import).

Nothing here imports triton: versions come from the package metadata.
"""
from __future__ import annotations

import importlib
import platform
from dataclasses import dataclass
from importlib import metadata
from typing import Optional

import torch


@dataclass(frozen=True)
class Machine:
    device: torch.device
    name: str                     # "NVIDIA H100 80GB HBM3", or the CPU's description
    capability: Optional[str]     # "9.0" on a GPU
    l2_bytes: Optional[int]       # None on a CPU: nothing to rotate against

    @property
    def gpu(self) -> bool:
        return self.device.type == "cuda"

    def as_json(self) -> dict:
        return {"type": self.device.type, "name": self.name, "capability": self.capability,
                "l2_bytes": self.l2_bytes}


def detect() -> Machine:
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        major, minor = torch.cuda.get_device_capability(0)
        return Machine(torch.device("cuda"), props.name, f"{major}.{minor}",
                       int(getattr(props, "L2_cache_size", 50 * 2**20)))
    cpu = platform.processor() or platform.machine() or "unknown CPU"
    return Machine(torch.device("cpu"), f"CPU ({cpu}, no CUDA GPU)", None, None)


def versions() -> dict[str, Optional[str]]:
    import tilews
    return {"python": platform.python_version(), "torch": torch.__version__,
            "triton": _dist_version("triton"), "mlx": _dist_version("mlx"), "tilews": tilews.__version__,
            "cuda": torch.version.cuda, "platform": platform.platform()}


def triton_unavailable(machine: Machine) -> Optional[str]:
    """Why a Triton kernel cannot run here, or None. On a CPU this switches Triton's interpreter on
    (only possible before triton is first imported), so call it right before building one."""
    if _dist_version("triton") is None:
        return "triton is not installed"
    if machine.gpu:
        return None
    try:
        from tilews.triton_ext.tl import ensure_interpreter
        ensure_interpreter()
    except Exception as e:  # noqa: BLE001 - any reason is reported, never raised
        return f"Triton's CPU interpreter is not available here: {e}"
    return None


def mps_unavailable(machine: Machine) -> Optional[str]:
    """Why torch cannot run on an Apple GPU (its MPS device) here, or None."""
    mps = getattr(torch.backends, "mps", None)
    if mps is None or not mps.is_available():
        return "torch has no MPS device here: it needs a Mac with an Apple GPU"
    return None


def mlx_unavailable(machine: Machine) -> Optional[str]:
    """Why mlx cannot run on an Apple GPU (Metal) here, or None."""
    try:
        import mlx.core as mx
    except (ImportError, OSError) as e:   # plain `mlx` on Linux fails to load libmlx.so
        return f"mlx is not importable here ({e}); on a Mac: pip install mlx"
    if not mx.metal.is_available():
        return "mlx has no Metal device here: it needs a Mac with an Apple GPU"
    return None


def optional_module(name: str):
    """``import name``, or None where it is absent (rich and matplotlib are optional)."""
    try:
        return importlib.import_module(name)
    except ImportError:
        return None


def _dist_version(name: str) -> Optional[str]:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None
