"""Target names (docs/design.md §8): which exist, what ``"auto"`` means on this machine, and the
machine's facts the backends are given.

``"auto"`` picks from the machine: a Hopper GPU -> ``"hopper"``, another CUDA/ROCm GPU ->
``"triton"``, an Apple GPU -> ``"metal"``, no GPU -> ``"interpret"``; ``"cuda"`` (TileLang's
name) picks the same where the GPU is a CUDA/ROCm one and is an error elsewhere. Which backends serve a
target is ``tilews.backends``'s business.

A process forked to compile (``tilews.compile_processes``) must not touch CUDA where its parent
has (CUDA cannot be initialized again in a forked child): its parent's ``snapshot`` of these facts
is ``pin``-ned there, and every function here answers from it.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from tilews.lowering.backend import Machine

TARGET_NAMES = ("auto", "interpret", "triton", "hopper", "metal", "cuda")


@dataclass(frozen=True)
class Snapshot:
    """This machine's facts as the functions here give them: ``machine()`` and what ``"auto"``
    picks."""
    machine: Machine
    choice: str


_PINNED: Optional[Snapshot] = None       # a forked compile child's: its parent's snapshot


def snapshot() -> Snapshot:
    """The facts a forked child is to answer with (``pin``)."""
    return Snapshot(machine(), _machine_choice())


def pin(facts: Snapshot) -> None:
    """From now on, in this process, answer from ``facts`` (a forked compile child's first step)."""
    global _PINNED
    _PINNED = facts


def resolve(name: str) -> tuple[str, tuple[str, ...]]:
    """(the target ``name`` stands for here, notes for the compile report). ``"cuda"``
    (TileLang's name) is ``"auto"`` on a machine with a CUDA GPU and an error elsewhere."""
    if name not in TARGET_NAMES:
        raise ValueError(f"target must be one of {', '.join(TARGET_NAMES)}; got {name!r}")
    if name == "cuda":
        choice = _machine_choice()
        if choice not in ("hopper", "triton"):
            raise ValueError(f"target 'cuda' needs a CUDA GPU; this machine has none (it would "
                             f"run on '{choice}': pass target='auto' for that)")
        return choice, (f"target 'cuda' is '{choice}' here",)
    if name == "auto":
        name = _machine_choice()
    return name, ()


def _machine_choice() -> str:
    if _PINNED is not None:
        return _PINNED.choice
    import torch
    if torch.cuda.is_available():
        if torch.version.hip is None and torch.cuda.get_device_capability() == (9, 0):
            return "hopper"
        return "triton"
    if getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available():
        return "metal"
    return "interpret"


def machine() -> Machine:
    """This machine, as the backends see it."""
    if _PINNED is not None:
        return _PINNED.machine
    import torch
    if not torch.cuda.is_available():
        return Machine()
    return Machine(cuda=True, capability=torch.cuda.get_device_capability(), num_sms=num_sms())


def num_sms(default: int = 132) -> int:
    """Streaming multiprocessors of the current CUDA device (a persistent grid's size); without
    a GPU, ``default`` (an H100 SXM's 132), so programs still build and run on the CPU paths."""
    if _PINNED is not None:
        return _PINNED.machine.num_sms if _PINNED.machine.cuda else default
    import torch
    if torch.cuda.is_available():
        return torch.cuda.get_device_properties(torch.cuda.current_device()).multi_processor_count
    return default
