"""Tiles as values: global regions as pointer tensors, on-chip buffers as register tensors.

A tile value has its region's ``tile_shape`` (unit dims dropped, ``(1,)`` when all are unit). A
global region becomes ``base + sum(offsets_d * stride_d)`` with one ``tl.arange`` per non-unit dim
(the last dim when all are unit), masked by ``offsets_d < dim_d`` (and ``offsets_d >= 0`` on the
dims the region's ``mask_low`` marks) when the copy's mechanism says so; offsets are 64-bit for the
buffers in the ``StreamPlan``'s ``wide_offsets``.
Shared and fragment buffers are register tensors reassigned whole (so a loop carries them with one
type); a local buffer of shape (1,) is a scalar. A tile operation takes a whole on-chip buffer or
a part of one that is whole along some dims and a single index along the others
(``A_s[k % stages, :, :]``), read and written through a mask over the buffer.
"""
from __future__ import annotations

from typing import Optional

from tilews.lowering import ir

from .context import TL_DTYPE, Ctx, shape_text
from .exprs import bounds, masked_load, offset, one_hot, spell


def region_ptr(ctx: Ctx, r: ir.Region, masked: bool) -> tuple[str, Optional[str], tuple[int, ...]]:
    """Pointer tensor, mask (None when unmasked) and tile shape of a global region."""
    b = r.buffer
    axes = [d for d, e in enumerate(r.extents) if e != 1] or [len(r.extents) - 1]
    terms, offsets = [ctx.name(b.name)], []
    for d, (start, extent) in enumerate(zip(r.starts, r.extents)):
        if d in axes:
            offs = ctx.fresh(f"{b.name}_i{d}")
            ctx.line(f"{offs} = {_plus(spell(ctx, start))}tl.arange(0, {extent})")
            k = axes.index(d)
            if len(axes) > 1:
                offs += f"[{', '.join(':' if j == k else 'None' for j in range(len(axes)))}]"
        else:
            offs = spell(ctx, start)
        terms.append(offset(ctx, b, d, offs))
        offsets.append(offs)
    mask = " & ".join(bounds(ctx, b, offsets, r.mask_low, r.loc)) if masked else None
    return " + ".join(terms), mask, tuple(r.extents[d] for d in axes)


def _plus(start: str) -> str:
    return "" if start == "0" else f"{start} + "


def store(ptr: str, value: str, mask: Optional[str]) -> str:
    return f"tl.store({ptr}, {value})" if mask is None else f"tl.store({ptr}, {value}, mask={mask})"


def require_whole(ctx: Ctx, r: ir.Region, loc: ir.Loc) -> None:
    b = r.buffer
    if not r.is_whole:
        raise ctx.unsupported(f"a part of on-chip buffer '{b.name}' in this tile operation", loc,
                              "the accumulator of a gemm is a whole fragment")


def _selected_dims(ctx: Ctx, r: ir.Region, loc: ir.Loc) -> list[int]:
    """The dims of an on-chip region that pick one index (the others are whole); a region of
    another form is unsupported."""
    picked = []
    for d, (start, extent, n) in enumerate(zip(r.starts, r.extents, r.buffer.static_shape)):
        if extent == n and ir.as_int(start) == 0:
            continue
        if extent != 1:
            raise ctx.unsupported(f"the part [{spell(ctx, start)}:+{extent}] of dimension {d} of "
                                  f"on-chip buffer '{r.buffer.name}'", loc,
                                  "a part of an on-chip buffer in a tile operation takes whole "
                                  "dims and single indices (A_s[k % stages, :, :])")
        picked.append(d)
    return picked


def _selection(ctx: Ctx, r: ir.Region, picked: list[int]) -> str:
    indices = [start if d in picked else None for d, start in enumerate(r.starts)]
    return one_hot(ctx, r.buffer, indices)


def buffer_value(ctx: Ctx, b: ir.Buffer) -> str:
    """The value of a whole on-chip buffer, shaped as the buffer (unit dims kept)."""
    x = ctx.name(b.name)
    return f"tl.full((1,), {x}, {TL_DTYPE[b.dtype]})" if b in ctx.scalars else x


def tile_value(ctx: Ctx, r: ir.Region, loc: ir.Loc) -> str:
    """The value of an on-chip region, shaped as its tile: the whole buffer, or the elements at
    single indices of some dims (selected with a mask and summed over those dims: every other
    term is 0)."""
    b = r.buffer
    x = buffer_value(ctx, b)
    picked = _selected_dims(ctx, r, loc)
    if picked:
        part = ctx.fresh(f"{b.name}_part")
        ctx.line(f"{part} = tl.where({_selection(ctx, r, picked)}, {x}, tl.zeros_like({x}))")
        for d in reversed(picked):
            ctx.line(f"{part} = tl.sum({part}, axis={d}).to({TL_DTYPE[b.dtype]})")
        x = part
    kept = tuple(n for d, n in enumerate(b.static_shape) if d not in picked)
    if kept != r.tile_shape:
        return f"tl.reshape({x}, {shape_text(r.tile_shape)})"
    return x


def assign_region(ctx: Ctx, r: ir.Region, value: str, shape: Optional[tuple[int, ...]],
                  dtype: ir.DType, loc: ir.Loc) -> None:
    """``r = value`` (see ``assign``); a part of the buffer at single indices of some dims is
    replaced where a mask selects it."""
    b = r.buffer
    picked = _selected_dims(ctx, r, loc)
    if not picked:
        assign(ctx, b, value, shape, dtype)
        return
    if shape is None:
        v = f"tl.full({shape_text(r.extents)}, {value}, {TL_DTYPE[b.dtype]})"
    else:
        v = value if tuple(shape) == tuple(r.extents) else f"tl.reshape({value}, {shape_text(r.extents)})"
        v = v if dtype == b.dtype else f"{v}.to({TL_DTYPE[b.dtype]})"
    x = ctx.name(b.name)
    ctx.line(f"{x} = tl.where({_selection(ctx, r, picked)}, {v}, {x})")


def assign(ctx: Ctx, b: ir.Buffer, value: str, shape: Optional[tuple[int, ...]],
           dtype: ir.DType) -> None:
    """``b = value``: a tensor of ``shape`` (None: a scalar) and ``dtype`` in ``b``'s form."""
    to = "" if dtype == b.dtype else f".to({TL_DTYPE[b.dtype]})"
    x = ctx.name(b.name)
    if b in ctx.scalars:
        value = value if shape is None else f"tl.sum({value}, axis=None)"
        ctx.line(f"{x} = tl.cast({value}, {TL_DTYPE[b.dtype]})")
    elif shape is None:
        ctx.line(f"{x} = tl.full({shape_text(b.static_shape)}, {value}, {TL_DTYPE[b.dtype]})")
    elif shape != b.static_shape:
        ctx.line(f"{x} = tl.reshape({value}, {shape_text(b.static_shape)}){to}")
    else:
        ctx.line(f"{x} = {value}{to}")
