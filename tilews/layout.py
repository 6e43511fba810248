"""Layouts a program may name (TileLang's ``tilelang.layout``): ``Layout`` (an index function) and
``make_swizzled_layout``. tilews lays out every on-chip buffer itself and keeps global tensors in
their logical (row-major) order, so a layout given with ``T.annotate_layout`` is a hint: a
swizzled layout for a shared buffer is what tilews does anyway, and any other is recorded in the
compile report, not applied."""
from __future__ import annotations

from typing import Callable, Sequence


class Layout:
    """``T.Layout(shape, fn)``: the layout mapping an index of a buffer of ``shape`` to
    ``fn(*index)`` (a list of coordinates). tilews records it and never calls ``fn``."""

    def __init__(self, shape: Sequence, forward_fn: Callable):
        if not callable(forward_fn):
            raise TypeError(f"T.Layout takes a shape and an index function, got {forward_fn!r}")
        self.shape = tuple(shape)
        self.forward_fn = forward_fn

    def describe(self) -> str:
        return "a layout given as an index function"


class SwizzledLayout(Layout):
    """What ``make_swizzled_layout`` returns: a bank-conflict-free (swizzled) shared layout."""

    def __init__(self, shape: Sequence):
        super().__init__(shape, lambda *index: list(index))

    def describe(self) -> str:
        return "a swizzled layout"


def make_swizzled_layout(buffer, k_major: bool = True, allow_pad: bool = True) -> SwizzledLayout:
    """A swizzled layout for ``buffer`` (a shared tile). ``k_major`` and ``allow_pad`` are
    TileLang's choices of swizzle; tilews picks the swizzle from the operations using the tile."""
    return SwizzledLayout(buffer.shape)
