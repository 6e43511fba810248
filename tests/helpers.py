"""Shared test utilities: locating marked source lines, random inputs, references."""
from __future__ import annotations

import inspect

import torch

from tilews.testing import poison_, rel_err  # noqa: F401  (rel_err re-exported for tests)


def marked_line(fn, marker: str = "# <- error") -> int:
    """The absolute line number of the line of ``fn``'s source containing ``marker``."""
    lines, start = inspect.getsourcelines(fn)
    hits = [start + i for i, text in enumerate(lines) if marker in text]
    assert len(hits) == 1, f"marker {marker!r} found {len(hits)} times"
    return hits[0]


def randn(*shape, dtype=torch.float32, seed=None, device="cpu"):
    """Random normal input, never all zeros."""
    g = torch.Generator().manual_seed(seed if seed is not None else hash(shape) % 2**31)
    return torch.randn(*shape, generator=g, dtype=torch.float32).to(dtype).to(device)


def poisoned(*shape, dtype=torch.float32, device="cpu"):
    """An output buffer full of NaN (or a sentinel for integers) before launch."""
    return poison_(torch.empty(*shape, dtype=dtype, device=device))
