"""``--shapes``: a comma list of preset names and explicit shapes (``1024x1024x512``) -> shapes.

Presets belong to a workload (a GEMM shape is MxNxK, an attention shape BxHxSxD); this module
only parses, against the presets, the dimension names and the modes it is given. A workload with
modes (attention: causal or not; the GEMM epilogue: its activation) ends each shape with one,
``4x32x4096x128:causal``; an explicit shape without its ``:mode`` stands for one shape per mode.
"""
from __future__ import annotations

from typing import Mapping, Sequence, Union

Shape = tuple[Union[int, str], ...]   # the dimensions, then the mode where the workload has modes
Form = tuple[Mapping[str, Sequence[Shape]], str, Sequence[str]]   # (presets, dims, modes)


class ShapeError(ValueError):
    """A ``--shapes`` entry that is neither a preset nor a well-formed explicit shape."""


def parse_shapes(text: str, presets: Mapping[str, Sequence[Shape]], dims: Sequence[str],
                 modes: Sequence[str] = ()) -> list[Shape]:
    """Shapes in the order given, duplicates dropped. ``dims`` names the dimensions (``"MNK"``),
    ``modes`` the modes a shape ends with (none for GEMM)."""
    shapes: list[Shape] = []
    for entry in entries(text):
        shapes += [s for s in parse_entry(entry, presets, dims, modes) if s not in shapes]
    return shapes


def assign_shapes(text: str, forms: Mapping[str, Form]) -> dict[str, list[Shape]]:
    """``--shapes`` for several workloads (``tilews-bench all``), named -> (presets, dims, modes):
    each entry goes to every workload it is a preset or a shape of; an entry that fits none is an
    error giving each workload's reason, and a workload that no entry fits gets no shapes."""
    taken: dict[str, list[Shape]] = {name: [] for name in forms}
    for entry in entries(text):
        reasons = []
        for name, form in forms.items():
            try:
                shapes = parse_entry(entry, *form)
            except ShapeError as e:
                reasons.append(f"{name}: {e}")
                continue
            taken[name] += [s for s in shapes if s not in taken[name]]
        if len(reasons) == len(forms):
            raise ShapeError(f"--shapes entry {entry!r} fits no workload ({'; '.join(reasons)})")
    return taken


def entries(text: str) -> list[str]:
    """The comma-separated entries of ``--shapes``; an empty one is an error."""
    parts = [e.strip() for e in text.split(",")]
    if not text.strip() or not all(parts):
        raise ShapeError(f"--shapes {text!r} has an empty entry; give preset names or shapes, "
                         f"separated by commas")
    return parts


def parse_entry(entry: str, presets: Mapping[str, Sequence[Shape]], dims: Sequence[str],
                modes: Sequence[str] = ()) -> list[Shape]:
    """One entry: a preset's shapes, or an explicit shape (one per mode when it names none)."""
    if entry in presets:
        return list(presets[entry])
    text, colon, mode = entry.lower().partition(":") if modes else (entry.lower(), "", "")
    parts = text.split("x")
    example, shape_form = _example(presets), form(dims, modes)
    if len(parts) == 1 and not text.isdigit():
        raise ShapeError(f"unknown shape preset {entry!r}; presets: {', '.join(presets)}; or give "
                         f"{shape_form} like {example}")
    if not all(p.isdigit() for p in parts):
        raise ShapeError(f"shape {entry!r} is not {shape_form} with positive integers (e.g. {example})")
    if len(parts) != len(dims):
        raise ShapeError(f"shape {entry!r} has {len(parts)} dimension(s); this workload's shapes are "
                         f"{shape_form} ({len(dims)} positive integers, e.g. {example})")
    if colon and mode not in modes:
        raise ShapeError(f"shape {entry!r} has the unknown mode {mode!r}; the modes are "
                         f"{', '.join(modes)} (or none: one shape per mode)")
    shape = tuple(int(p) for p in parts)
    if min(shape) <= 0:
        raise ShapeError(f"shape {entry!r} has a zero dimension; every dimension of {shape_form} "
                         f"must be >= 1")
    return [shape + (m,) for m in ([mode] if mode else modes)] if modes else [shape]


def form(dims: Sequence[str], modes: Sequence[str] = ()) -> str:
    """How a workload's shapes are written: ``MxNxK``, ``BxHxSxD[:causal|noncausal]``."""
    return "x".join(dims) + (f"[:{'|'.join(modes)}]" if modes else "")


def shape_text(shape: Shape) -> str:
    """``1024x1024x512``, ``4x32x4096x128:causal``: what ``--shapes`` reads back."""
    dims = [str(d) for d in shape if isinstance(d, int)]
    modes = [d for d in shape if isinstance(d, str)]
    return "x".join(dims) + "".join(f":{m}" for m in modes)


def _example(presets: Mapping[str, Sequence[Shape]]) -> str:
    """A shape of this workload to show in an error: its first preset's first."""
    return next((shape_text(s[0]) for s in presets.values() if s), "1024x1024x512")


def with_modes(shapes: Sequence[Shape], modes: Sequence[str]) -> tuple[Shape, ...]:
    """Each shape once per mode, in that order: a preset of a workload with modes."""
    return tuple(shape + (mode,) for shape in shapes for mode in modes)
