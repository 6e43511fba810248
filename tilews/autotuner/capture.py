"""``with set_autotune_inputs(a, b):``: the tensors the autotuner benchmarks with.

Contract: inside the block (on the thread that entered it), ``get_autotune_inputs()`` is the list
of tensors given, innermost block first; outside any block it is ``None``. The autotuner reads it
when tuning starts and then benchmarks every configuration on (copies of) those tensors instead of
generated ones, in the order the kernel takes its inputs.
"""
from __future__ import annotations

import threading
from typing import Any, Optional

_stack = threading.local()


def _entries() -> list[list[Any]]:
    if not hasattr(_stack, "entries"):
        _stack.entries = []
    return _stack.entries


class AutotuneInputs:
    """The context manager ``set_autotune_inputs`` returns."""

    def __init__(self, tensors: list[Any]):
        self.tensors = tensors

    def __enter__(self) -> None:
        _entries().append(self.tensors)

    def __exit__(self, *exc_info) -> None:
        _entries().pop()


def set_autotune_inputs(*tensors) -> AutotuneInputs:
    """``set_autotune_inputs(a, b, c)`` or ``set_autotune_inputs([a, b, c])``."""
    if len(tensors) == 1 and isinstance(tensors[0], (list, tuple)):
        return AutotuneInputs(list(tensors[0]))
    return AutotuneInputs(list(tensors))


def get_autotune_inputs() -> Optional[list[Any]]:
    entries = _entries()
    return entries[-1] if entries else None
