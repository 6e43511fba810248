"""Spelling the layouts lowering chose (``lowering/layouts.py`` records) as Gluon layouts.

A layout derived from another (a slice of an accumulator, a register A operand of a gemm) names
its parent's module-level constant, which ``ctx.layout_const`` declares first. A record without a
rule is an ``InternalError``.
"""
from __future__ import annotations

from tilews.lowering import layouts as L
from tilews.lowering.errors import InternalError


def spell_layout(ctx, layout) -> str:
    """The Gluon expression constructing ``layout`` at module level."""
    if isinstance(layout, L.WgmmaAccumulator):
        return (f"gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta={list(layout.warps_per_cta)}, "
                f"instr_shape={list(layout.instr_shape)})")
    if isinstance(layout, L.NVMMAShared):
        return (f"gl.NVMMASharedLayout(swizzle_byte_width={layout.swizzle_bytes}, element_bitwidth="
                f"{layout.element_bits}, rank={layout.rank}, transposed={layout.transposed})")
    if isinstance(layout, L.RowSlice):
        return f"gl.SliceLayout({layout.dim}, {ctx.layout_const(layout.parent)}.value)"
    if isinstance(layout, L.WgmmaOperandA):
        return (f"gl.DotOperandLayout(operand_index=0, parent={ctx.layout_const(layout.parent)}.value, "
                f"k_width={layout.k_width})")
    if isinstance(layout, L.Blocked):
        if layout.rank == 1:
            return f"gl.BlockedLayout([1], [32], [{layout.num_warps}], [0])"
        if layout.rank == 2:
            across = layout.threads_along_row
            return (f"gl.BlockedLayout([1, {layout.vector}], [{32 // across}, {across}], "
                    f"[{layout.num_warps}, 1], [1, 0])")
    raise InternalError(f"gluon backend: no rule for layout {layout!r}", ctx.kernel.loc)
