"""Compilation hints: ``T.annotate_layout``, ``T.set_max_nreg`` (and ``T.inc_max_nreg`` /
``T.dec_max_nreg``), ``T.no_set_max_nreg`` / ``T.disable_warp_group_reg_alloc``. tilews decides
layouts and register counts itself: what it applies is said per function; the rest goes to the
compile report's notes (``kernel.report``)."""
from __future__ import annotations

from tilews.layout import Layout, SwizzledLayout
from tilews.lowering import ir
from tilews.lowering.frontend import hints, semantic
from tilews.lowering.frontend.values import BufferRef


def annotate_layout(layout_map: dict) -> None:
    """``T.annotate_layout({buffer: layout, ...})``, each layout a ``T.Layout``, an index function
    (made a ``T.Layout`` of the buffer's shape) or ``tilews.layout.make_swizzled_layout(buffer)``.
    A swizzled layout of a shared buffer is honoured (tilews swizzles shared tiles itself); every
    other layout is recorded in the compile report and not applied: tilews lays out on-chip
    buffers itself and keeps global tensors in row-major order (two kernels exchanging a tensor
    through one annotated layout see the same values either way)."""
    if not isinstance(layout_map, dict):
        raise semantic.err(f"T.annotate_layout takes a dict of buffer: layout, got {layout_map!r}")
    for buf, layout in layout_map.items():
        if not isinstance(buf, BufferRef):
            raise semantic.err(f"T.annotate_layout: keys must be buffers, got {buf!r}")
        if callable(layout) and not isinstance(layout, Layout):
            layout = Layout(buf.shape, layout)
        if not isinstance(layout, Layout):
            raise semantic.err(f"T.annotate_layout: the layout of '{buf.buffer.name}' must be a "
                               f"T.Layout or an index function, got {layout!r}")
        scope = buf.buffer.scope
        if isinstance(layout, SwizzledLayout) and scope is ir.Scope.SHARED:
            continue
        hints.note(f"T.annotate_layout: {layout.describe()} for {scope.value} buffer "
                   f"'{buf.buffer.name}' is recorded, not applied (tilews lays out on-chip "
                   f"buffers itself and keeps global tensors in row-major order)")


def set_max_nreg(reg_count: int, is_inc: int) -> None:
    """Registers per thread for the ``T.ws`` role this is called in (a multiple of 8 from 24 to
    256; ``is_inc`` 1 to raise the count, 0 to lower it). On Hopper a role other than Triton's
    default partition gets exactly this count; the default partition (the first role holding
    gemms) gets what the other roles leave, and the report says so where that differs. Outside
    every role, and on targets without warp specialization, it is recorded in the report."""
    hints.set_max_nreg(reg_count, is_inc)


def inc_max_nreg(reg_count: int) -> None:
    """``T.set_max_nreg(reg_count, 1)``."""
    hints.set_max_nreg(reg_count, 1)


def dec_max_nreg(reg_count: int) -> None:
    """``T.set_max_nreg(reg_count, 0)``."""
    hints.set_max_nreg(reg_count, 0)


def no_set_max_nreg() -> None:
    """TileLang: every warp keeps the launch's register count. Recorded in the report: Triton's
    warp specialization always sets each partition's count, which tilews budgets."""
    hints.no_set_max_nreg()


disable_warp_group_reg_alloc = no_set_max_nreg
