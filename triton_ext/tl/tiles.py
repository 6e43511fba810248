"""Tiles as values: global regions as pointer tensors, on-chip buffers as register tensors.

A tile value has its region's ``tile_shape`` (unit dims dropped, ``(1,)`` when all are unit), held
in a tensor of ``StreamPlan.tile`` of it: padded to powers of two on Triton, the padding zero. A
global region becomes ``base + sum(offsets_d * stride_d)`` with one ``tl.arange`` per non-unit dim
(the last dim when all are unit), masked by ``offsets_d < dim_d`` (and ``offsets_d >= 0`` on the
dims the region's ``mask_low`` marks) when the copy's mechanism says so, and by the tile's extents
where it is padded (never reading or writing past the region); offsets are 64-bit for the buffers
in the ``StreamPlan``'s ``wide_offsets``.
Shared and fragment buffers are register tensors reassigned whole (so a loop carries them with one
type), their padding zero after every assignment; a local buffer of shape (1,) is a scalar. A tile
operation takes a whole on-chip buffer or a part of one: per dim the whole extent, a single index
(``A_s[k % stages, :, :]``, selected with a mask) or a range ``[start:+extent]`` at a static or
runtime start (``acc[:valid, :]``, moved with ``tl.gather`` along that dim).
"""
from __future__ import annotations

from typing import Optional

from tilews.lowering import ir

from .context import TL_DTYPE, Ctx, arange, shape_text
from .exprs import bounds, offset, one_hot, spell


def region_ptr(ctx: Ctx, r: ir.Region, masked: bool) -> tuple[str, Optional[str], tuple[int, ...]]:
    """Pointer tensor, mask (None when unmasked) and tile shape of a global region."""
    b = r.buffer
    axes = [d for d, e in enumerate(r.extents) if e != 1] or [len(r.extents) - 1]
    shape = ctx.plan.tile([r.extents[d] for d in axes])
    terms, offsets = [ctx.name(b.name)], []
    for d, (start, extent) in enumerate(zip(r.starts, r.extents)):
        if d in axes:
            k = axes.index(d)
            offs = ctx.fresh(f"{b.name}_i{d}")
            ctx.line(f"{offs} = {_plus(spell(ctx, start))}tl.arange(0, {shape[k]})")
            if len(axes) > 1:
                offs += f"[{', '.join(':' if j == k else 'None' for j in range(len(axes)))}]"
        else:
            offs = spell(ctx, start)
        terms.append(offset(ctx, b, d, offs))
        offsets.append(offs)
    conds = bounds(ctx, b, offsets, r.mask_low, r.loc) if masked else []
    valid = ctx.valid([r.extents[d] for d in axes])
    mask = " & ".join(conds + ([valid] if valid else [])) or None
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


def _parts(r: ir.Region) -> tuple[list[int], list[int]]:
    """The dims of an on-chip region that pick one index, and those that take a range of it (the
    others are whole)."""
    picked, ranged = [], []
    for d, (start, extent, n) in enumerate(zip(r.starts, r.extents, r.buffer.static_shape)):
        if extent == n and ir.as_int(start) == 0:
            continue
        (picked if extent == 1 else ranged).append(d)
    return picked, ranged


def buffer_value(ctx: Ctx, b: ir.Buffer) -> str:
    """The value of a whole on-chip buffer, shaped as the buffer (unit dims kept)."""
    x = ctx.name(b.name)
    return f"tl.full((1,), {x}, {TL_DTYPE[ctx.held(b.dtype)]})" if b in ctx.scalars else x


def tile_value(ctx: Ctx, r: ir.Region, loc: ir.Loc) -> str:
    """The value of an on-chip region, shaped as its tile: the whole buffer, its ranges gathered
    (the padding past each range zeroed), and the elements at single indices of some dims
    (selected with a mask and summed over those dims: every other term is 0)."""
    b = r.buffer
    x = buffer_value(ctx, b)
    picked, ranged = _parts(r)
    shape, rank = list(ctx.shape(b)), len(b.static_shape)
    if ranged:
        for d in ranged:
            shape[d] = ctx.plan.tile([r.extents[d]])[0]
            lanes = f"{_plus(spell(ctx, r.starts[d]))}{arange(shape[d], d, rank)}"
            index = f"tl.minimum(tl.maximum({lanes}, 0), {b.static_shape[d] - 1})"
            x = f"tl.gather({x}, tl.broadcast_to({index}, {shape_text(shape)}), {d})"
        x = _zero_padding(ctx, x, [r.extents[d] if d in ranged else n
                                   for d, n in enumerate(b.static_shape)])
    if picked:
        part = ctx.fresh(f"{b.name}_part")
        ctx.line(f"{part} = tl.where({_selection(ctx, r, picked)}, {x}, tl.zeros_like({x}))")
        for d in reversed(picked):
            ctx.line(f"{part} = tl.sum({part}, axis={d}).to({TL_DTYPE[ctx.held(b.dtype)]})")
        x = part
    kept = tuple(n for d, n in enumerate(shape) if d not in picked)
    tile = ctx.plan.tile(r.tile_shape)
    if kept == tile:
        return x
    # one element picked in every dim is a scalar, which tl.reshape does not take
    return f"tl.{'reshape' if kept else 'broadcast_to'}({x}, {shape_text(tile)})"


def _selection(ctx: Ctx, r: ir.Region, picked: list[int]) -> str:
    return one_hot(ctx, r.buffer, [start if d in picked else None for d, start in enumerate(r.starts)])


def _zero_padding(ctx: Ctx, value: str, extents) -> str:
    """``value``, a tensor holding a tile of ``extents``, with its padding zero."""
    valid = ctx.valid(extents)
    if valid is None:
        return value
    x = ctx.fresh("padded")
    ctx.line(f"{x} = {value}")
    return f"tl.where({valid}, {x}, tl.zeros_like({x}))"


def assign_region(ctx: Ctx, r: ir.Region, value: str, shape: Optional[tuple[int, ...]],
                  dtype: ir.DType, loc: ir.Loc) -> None:
    """``r = value`` (see ``assign``); a part of the buffer is replaced where a mask selects it:
    single indices of some dims, ranges of others (the value gathered along them into place)."""
    b = r.buffer
    picked, ranged = _parts(r)
    if not picked and not ranged:
        assign(ctx, b, value, shape, dtype)
        return
    rank = len(b.static_shape)
    if shape is None:
        v = _full(ctx, [1] * rank, value, dtype, b.dtype)
    else:
        cur = list(ctx.plan.tile(r.extents))
        v = value if ctx.plan.tile(shape) == tuple(cur) else f"tl.reshape({value}, {shape_text(cur)})"
        v = v if dtype == b.dtype else ctx.to(v, b.dtype)
        for d in ranged:
            width, cur[d] = cur[d], ctx.shape(b)[d]
            lanes = f"{arange(cur[d], d, rank)}{_minus(spell(ctx, r.starts[d]))}"
            index = f"tl.minimum(tl.maximum({lanes}, 0), {width - 1})"
            v = f"tl.gather({v}, tl.broadcast_to({index}, {shape_text(cur)}), {d})"
    conds = [_selection(ctx, r, picked)] if picked else []
    for d in ranged:
        start, lane = spell(ctx, r.starts[d]), arange(ctx.shape(b)[d], d, rank)
        conds += [f"({lane} >= {start})", f"({lane} < {_plus(start)}{r.extents[d]})"]
    x = ctx.name(b.name)
    ctx.line(f"{x} = tl.where({' & '.join(conds)}, {v}, {x})")


def _minus(start: str) -> str:
    return "" if start == "0" else f" - ({start})"


def assign(ctx: Ctx, b: ir.Buffer, value: str, shape: Optional[tuple[int, ...]],
           dtype: ir.DType, dirty: bool = False) -> None:
    """``b = value``: a tensor holding a tile of ``shape`` (None: a scalar) and ``dtype`` in
    ``b``'s form. The value's padding is zero unless ``dirty`` says it may not be (a scalar
    fills it): then it is zeroed here."""
    x = ctx.name(b.name)
    if b in ctx.scalars:
        value = value if shape is None else f"tl.sum({value}, axis=None)"
        held = TL_DTYPE[ctx.held(b.dtype)]
        ctx.line(f"{x} = {f'tl.cast({value}, {held})' if dtype == b.dtype else ctx.cast(value, b.dtype)}")
        return
    converted = dtype == b.dtype
    if shape is None:
        value, converted = _full(ctx, ctx.shape(b), value, dtype, b.dtype), True
        dirty = True
    elif ctx.plan.tile(shape) != ctx.shape(b):
        value = f"tl.reshape({value}, {shape_text(ctx.shape(b))})"
    if dirty:
        value = _zero_padding(ctx, value, b.static_shape)
    ctx.line(f"{x} = {value if converted else ctx.to(value, b.dtype)}")


def _full(ctx: Ctx, shape, value: str, dtype: ir.DType, to: ir.DType) -> str:
    """A tensor of ``shape`` filled with ``value`` (of ``dtype``) converted to ``to``."""
    if dtype != to and to in ctx.plan.f32_values:
        value = ctx.cast(value, to)
    return f"tl.full({shape_text(shape)}, {value}, {TL_DTYPE[ctx.held(to)]})"
