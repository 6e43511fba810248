"""Tensors for tests: ``torch_assert_close`` (closeness with a budget of mismatched elements) and
``get_tensor_supply`` (TileLang's per-parameter input generator, drawing ``TensorSupplyType``'s
values from ``tilews.profiler.supply``)."""
from __future__ import annotations

from typing import Callable

import torch

from tilews.profiler.supply import TensorSupplyType, generate

from .device import best_device

__all__ = ["TensorSupplyType", "get_tensor_supply", "torch_assert_close"]

# compared as int64 (torch.promote_types refuses them): their values fit unless they overflow
_WIDE_UNSIGNED = (torch.uint16, torch.uint32, torch.uint64)


def get_tensor_supply(supply_type: TensorSupplyType = TensorSupplyType.Integer
                      ) -> Callable[..., torch.Tensor]:
    """A function from a kernel parameter (``kernel.params[i]``) to a fresh tensor of its shape and
    dtype holding ``supply_type``'s values, on the current CUDA device or else the CPU. A parameter
    with a runtime (``T.dynamic``) dimension, or a runtime scalar, has no shape to fill: a
    ``ValueError`` naming it."""
    supply_type = TensorSupplyType(supply_type)

    def supply(param) -> torch.Tensor:
        if param.is_scalar() or any(isinstance(d, str) for d in param.shape):
            raise ValueError(f"get_tensor_supply: parameter '{param.name}' has no static shape "
                             f"({param.shape}); it needs a tensor of a static shape")
        return generate(param.shape, param.torch_dtype(), supply_type, best_device())
    return supply


def torch_assert_close(tensor_a: torch.Tensor, tensor_b: torch.Tensor, rtol: float = 1e-2,
                       atol: float = 1e-3, max_mismatched_ratio: float = 0.001,
                       verbose: bool = False, equal_nan: bool = True, check_device: bool = True,
                       check_dtype: bool = True, check_layout: bool = True,
                       check_stride: bool = False, base_name: str = "LHS",
                       ref_name: str = "RHS") -> bool:
    """Assert that ``tensor_a`` is close to ``tensor_b`` (``torch.isclose`` with ``rtol`` and
    ``atol``) except for at most ``int(numel * max_mismatched_ratio)`` elements; True if so.

    The shapes must be equal, and the devices, dtypes, layouts (and strides, with
    ``check_stride``) unless their ``check_*`` is off; tensors that then differ in those are
    compared on the CPU, in their promoted dtype, dense. Too many mismatches raise an
    ``AssertionError`` giving the count against the budget, the first mismatch (its index and
    values), the greatest absolute and relative differences, and both tensors (named
    ``base_name`` and ``ref_name``). ``verbose`` prints the count in every case."""
    _check_attributes(tensor_a, tensor_b, check_device, check_dtype, check_layout, check_stride)
    a, b = _comparable(tensor_a, tensor_b)
    mismatched = ~torch.isclose(a, b, rtol=rtol, atol=atol, equal_nan=equal_nan)
    count, total = int(mismatched.sum().item()), a.numel()
    allowed = int(total * max_mismatched_ratio)
    if verbose:
        print(f"Number of mismatched elements: {count} / {total} (allowed: {allowed})")
    if count <= allowed:
        return True
    diff = (a - b).abs()
    raise AssertionError(
        f"Too many mismatched elements: {count} > {allowed} ({max_mismatched_ratio * 100:.2f}% "
        f"allowed, but get {count / total * 100:.2f}%).{_first_mismatch(a, b, mismatched)}"
        f"\nGreatest absolute difference: {diff.max().item()}, Greatest relative difference: "
        f"{(diff / (b.abs() + 1e-12)).max().item()}"
        f"\n{base_name}: {tensor_a}\n{ref_name}: {tensor_b}")


def _check_attributes(a: torch.Tensor, b: torch.Tensor, device: bool, dtype: bool, layout: bool,
                      stride: bool) -> None:
    checks = [("shape", True, a.shape, b.shape),
              ("device", device, a.device, b.device),
              ("dtype", dtype, a.dtype, b.dtype),
              ("layout", layout, a.layout, b.layout),
              ("stride()", stride and a.layout == b.layout == torch.strided,
               a.stride() if a.layout == torch.strided else None,
               b.stride() if b.layout == torch.strided else None)]
    for name, on, x, y in checks:
        if on and x != y:
            raise AssertionError(f"The values for attribute '{name}' do not match: {x} != {y}.")


def _comparable(a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``a`` and ``b`` on one device (the CPU if theirs differ), in one dtype, dense."""
    if a.device != b.device:
        a, b = a.cpu(), b.cpu()
    if a.dtype != b.dtype:
        dtype = torch.promote_types(*(torch.int64 if t.dtype in _WIDE_UNSIGNED else t.dtype
                                      for t in (a, b)))
        a, b = a.to(dtype), b.to(dtype)
    return tuple(t if t.layout == torch.strided else t.to_dense() for t in (a, b))


def _first_mismatch(a: torch.Tensor, b: torch.Tensor, mismatched: torch.Tensor) -> str:
    flat = int(mismatched.reshape(-1).nonzero()[0].item())
    index = [int(i) for i in torch.unravel_index(torch.tensor(flat), a.shape)]
    x, y = a.reshape(-1)[flat].item(), b.reshape(-1)[flat].item()
    return (f"\nFirst mismatch at index {index}: lhs={x:.6f}, rhs={y:.6f}, abs_diff={abs(x - y):.6f}, "
            f"rel_diff={abs(x - y) / (abs(y) + 1e-12):.6f}")
