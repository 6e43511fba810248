"""The CUDA compute capability, as TileLang's ``tilelang.contrib.nvcc`` reports it ("9.0"), read
from torch's current device: tilews needs no nvcc to answer."""
from __future__ import annotations

import torch


def get_target_compute_version() -> str:
    """The current CUDA device's compute capability, ``"major.minor"``; a ``ValueError`` on a
    machine without a CUDA GPU (a ROCm GPU is not one)."""
    if not torch.cuda.is_available() or torch.version.hip is not None:
        raise ValueError("no CUDA GPU is visible to torch, so there is no compute capability to "
                         "report")
    major, minor = torch.cuda.get_device_capability()
    return f"{major}.{minor}"


def parse_compute_version(compute_version: str) -> tuple[int, int]:
    """``"8.6"`` -> ``(8, 6)``; a ``RuntimeError`` naming a string of another form."""
    parts = str(compute_version).split(".")
    try:
        return int(parts[0]), int(parts[1])
    except (IndexError, ValueError):
        raise RuntimeError(f"compute version {compute_version!r} is not 'major.minor'") from None
