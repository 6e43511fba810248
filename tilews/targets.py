"""Target selection (DESIGN §8): a name -> the ``Target`` the compiler builds for.

``"auto"`` picks from the machine: a Hopper GPU -> ``"hopper"``, another CUDA/ROCm GPU ->
``"triton"``, an Apple GPU -> ``"metal"``, no GPU -> ``"interpret"``. Backends this version does
not have yet are reported, never silently replaced: ``auto`` falls back with a note in the compile
report, an explicit request is an error. ``"hopper"`` on a machine without a GPU compiles fully
(compile-only); only calling the kernel needs the GPU.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from tilews.lowering import target as tg
from tilews.lowering.errors import CompileError

TARGET_NAMES = ("auto", "interpret", "triton", "hopper", "metal")
_NOT_YET = {"metal": "the Metal backend"}


@dataclass(frozen=True)
class Selection:
    target: tg.Target
    notes: tuple[str, ...] = ()


def has_cuda() -> bool:
    import torch
    return torch.cuda.is_available()


def _machine_choice() -> str:
    import torch
    if torch.cuda.is_available():
        if torch.version.hip is None and torch.cuda.get_device_capability() == (9, 0):
            return "hopper"
        return "triton"
    if getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available():
        return "metal"
    return "interpret"


def select(name: str) -> Selection:
    if name not in TARGET_NAMES:
        raise ValueError(f"target must be one of {', '.join(TARGET_NAMES)}; got {name!r}")
    notes: tuple[str, ...] = ()
    if name == "auto":
        name = _machine_choice()
        if name in _NOT_YET:
            notes = (f"auto: this machine suits target '{name}', but {_NOT_YET[name]} is not in this "
                     f"version of tilews; using 'interpret'",)
            name = "interpret"
    elif name in _NOT_YET:
        raise CompileError(f"target '{name}': {_NOT_YET[name]} is not in this version of tilews; "
                           f"use target='triton' or 'interpret'")
    if name == "interpret":
        return Selection(tg.INTERPRET, notes)
    if name == "hopper":   # without a GPU: compile-only (calling the kernel needs an H100/H200)
        return Selection(dataclasses.replace(tg.HOPPER, num_sms=num_sms()), notes)
    return Selection(plain_triton(), notes)


def plain_triton() -> tg.Target:
    """``triton.language`` on this machine: the GPU, or Triton's CPU interpreter."""
    return tg.TRITON_GPU if has_cuda() else tg.TRITON_CPU


def num_sms(default: int = 132) -> int:
    """Streaming multiprocessors of the current CUDA device (a persistent grid's size); without
    a GPU, ``default`` (an H100 SXM's 132), so programs still build and run on the CPU paths."""
    import torch
    if torch.cuda.is_available():
        return torch.cuda.get_device_properties(torch.cuda.current_device()).multi_processor_count
    return default
