"""Comparing a kernel's outputs with a reference program's (``Profiler.assert_allclose``).

Both results are normalized to lists (a tensor -> ``[t]``, a tuple or list -> a list, None ->
``[]``); the counts must match, and each pair must agree in shape, dtype and device (an
``AssertionError`` names the output and what differs). Values are compared in float64 (FP8 through
float32, as TileLang does) by ``isclose(rtol, atol)``, NaN equal to NaN; at most
``int(numel * max_mismatched_ratio)`` elements may differ, else an ``AssertionError`` gives the
mismatch ratio and the worst element (the one furthest beyond its tolerance). A pair holding None
on either side is skipped, as TileLang does (a reference may mark an output it cannot compute).
"""
from __future__ import annotations

import torch


def assert_outputs_close(kernel_outs, ref_outs, *, atol: float, rtol: float,
                         max_mismatched_ratio: float) -> None:
    outs, refs = _as_list(kernel_outs, "the kernel"), _as_list(ref_outs, "the reference program")
    if len(outs) != len(refs):
        raise AssertionError(f"the kernel returned {len(outs)} output(s), the reference program "
                             f"{len(refs)}")
    for i, (out, ref) in enumerate(zip(outs, refs)):
        if out is None or ref is None:
            continue
        for who, t in (("the kernel", out), ("the reference program", ref)):
            if not isinstance(t, torch.Tensor):
                raise AssertionError(f"output {i} of {who} is a {type(t).__name__}, not a tensor")
        for attr in ("shape", "dtype", "device"):
            a, b = getattr(out, attr), getattr(ref, attr)
            if a != b:
                raise AssertionError(f"output {i}: {attr} {_show(a)} from the kernel, {_show(b)} from "
                                     f"the reference program")
        _assert_values_close(i, out, ref, atol, rtol, max_mismatched_ratio)


def _as_list(outs, who: str) -> list:
    if outs is None:
        return []
    if isinstance(outs, torch.Tensor):
        return [outs]
    if isinstance(outs, (list, tuple)):
        return list(outs)
    raise AssertionError(f"{who} returned a {type(outs).__name__}; expected a tensor, a list or "
                         f"tuple of tensors, or None")


def _show(value) -> str:
    return str(tuple(value)) if isinstance(value, torch.Size) else str(value)


_FP8 = (torch.float8_e4m3fn, torch.float8_e5m2)


def _widened(t: torch.Tensor) -> torch.Tensor:
    # FP8 is compared in float32 as TileLang does (exact, then widened again)
    t = t.detach()
    return (t.to(torch.float32) if t.dtype in _FP8 else t).to(torch.float64)


def _assert_values_close(i: int, out: torch.Tensor, ref: torch.Tensor, atol: float, rtol: float,
                         max_mismatched_ratio: float) -> None:
    a, b = _widened(out), _widened(ref)
    close = torch.isclose(a, b, rtol=rtol, atol=atol, equal_nan=True)
    bad = int((~close).sum())
    allowed = int(a.numel() * max_mismatched_ratio)
    if bad <= allowed:
        return
    excess = (a - b).abs() - (atol + rtol * b.abs())
    excess = torch.where(close, float("-inf"), torch.nan_to_num(excess, nan=float("inf")))
    worst = tuple(int(k) for k in torch.unravel_index(torch.argmax(excess), a.shape))
    raise AssertionError(
        f"output {i}: {bad} of {a.numel()} elements ({bad / a.numel():.2%}) differ beyond atol={atol}, "
        f"rtol={rtol}; at most {max_mismatched_ratio:.2%} ({allowed}) may. Worst at index "
        f"{list(worst)}: kernel {a[worst].item()!r}, reference {b[worst].item()!r}")
