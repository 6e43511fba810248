"""``--shapes``: a comma list of preset names and explicit shapes (``1024x1024x512``) -> shapes.

Presets belong to a workload (a GEMM shape is MxNxK, an attention shape something else); this
module only parses, against the presets and the dimension names it is given.
"""
from __future__ import annotations

from typing import Mapping, Sequence

Shape = tuple[int, ...]


class ShapeError(ValueError):
    """A ``--shapes`` entry that is neither a preset nor a well-formed explicit shape."""


def parse_shapes(text: str, presets: Mapping[str, Sequence[Shape]], dims: Sequence[str]) -> list[Shape]:
    """Shapes in the order given, duplicates dropped. ``dims`` names the dimensions (``"MNK"``)."""
    entries = [e.strip() for e in text.split(",")]
    if not text.strip() or not all(entries):
        raise ShapeError(f"--shapes {text!r} has an empty entry; give preset names or shapes like "
                         f"{_example(dims)}, separated by commas")
    shapes: list[Shape] = []
    for entry in entries:
        for shape in presets[entry] if entry in presets else (parse_shape(entry, presets, dims),):
            if shape not in shapes:
                shapes.append(shape)
    return shapes


def parse_shape(entry: str, presets: Mapping[str, Sequence[Shape]], dims: Sequence[str]) -> Shape:
    form = "x".join(dims)
    parts = entry.lower().split("x")
    if len(parts) == 1 and not entry.isdigit():
        raise ShapeError(f"unknown shape preset {entry!r}; presets: {', '.join(presets)}; or give "
                         f"{form} like {_example(dims)}")
    if not all(p.isdigit() for p in parts):
        raise ShapeError(f"shape {entry!r} is not {form} with positive integers (e.g. {_example(dims)})")
    if len(parts) != len(dims):
        raise ShapeError(f"shape {entry!r} has {len(parts)} dimension(s); this workload's shapes are "
                         f"{form} ({len(dims)} positive integers, e.g. {_example(dims)})")
    shape = tuple(int(p) for p in parts)
    if min(shape) <= 0:
        raise ShapeError(f"shape {entry!r} has a zero dimension; every dimension of {form} must be >= 1")
    return shape


def shape_text(shape: Shape) -> str:
    return "x".join(str(d) for d in shape)


def _example(dims: Sequence[str]) -> str:
    return "x".join(["1024", "1024", "512", "128", "64"][:len(dims)])
