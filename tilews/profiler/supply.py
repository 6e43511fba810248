"""Generated kernel inputs: ``TensorSupplyType`` and the values each type draws (TileLang's).

=========  ==================================================================================
Auto       fp16/bf16/fp32: uniform(-1, 1); unsigned ints: randint[0, 3); fp8: int8 values
           randint[-128, 128) converted to fp8 by value (rounded to the fp8 grid: e4m3fn and
           e5m2 hold +-448 and +-57344, so no draw is ever NaN); bool: {0, 1}; every other dtype
           (signed ints, fp64): randint[-2, 3)
Integer    randint[-2, 3) in the parameter's dtype, with Auto's unsigned/fp8/bool cases
Uniform    uniform(-1, 1) drawn in fp32, converted
Normal     normal with mean -1 and std 1 (TileLang's quirk, kept), drawn in fp32, converted
Randn      standard normal, drawn in fp32, converted
Zero, One  all zeros, all ones
=========  ==================================================================================

Under Uniform and Normal, int8 parameters are all ones (as in TileLang). Values come from torch's
global generator, so ``torch.manual_seed`` makes them repeatable.
"""
from __future__ import annotations

import enum
from typing import Sequence

import torch

_FP8 = (torch.float8_e4m3fn, torch.float8_e5m2)
_UNSIGNED = (torch.uint8, torch.uint16, torch.uint32, torch.uint64)
_UNIFORM_UNDER_AUTO = (torch.float16, torch.bfloat16, torch.float32)


class TensorSupplyType(enum.IntEnum):
    """How ``Profiler.supply`` fills the kernel's inputs (module docstring)."""
    Integer = 1
    Uniform = 2
    Normal = 3
    Randn = 4
    Zero = 5
    One = 6
    Auto = 7


def generate(shape: Sequence[int], dtype: torch.dtype, supply_type: TensorSupplyType,
             device: torch.device) -> torch.Tensor:
    """A fresh tensor of ``shape`` and ``dtype`` on ``device`` with ``supply_type``'s values."""
    shape = tuple(shape)
    if supply_type in (TensorSupplyType.Auto, TensorSupplyType.Integer):
        return _integer_like(shape, dtype, device, floats_uniform=supply_type is TensorSupplyType.Auto)
    if supply_type is TensorSupplyType.Zero:
        return torch.zeros(shape, dtype=dtype, device=device)
    if supply_type is TensorSupplyType.One:
        return torch.ones(shape, dtype=dtype, device=device)
    if dtype == torch.int8 and supply_type in (TensorSupplyType.Uniform, TensorSupplyType.Normal):
        return torch.ones(shape, dtype=dtype, device=device)
    return _FLOAT_DRAWS[supply_type](torch.empty(shape, dtype=torch.float32, device=device)).to(dtype)


# the draws made in fp32 and converted to the parameter's dtype
_FLOAT_DRAWS = {TensorSupplyType.Uniform: lambda t: t.uniform_(-1.0, 1.0),
                TensorSupplyType.Normal: lambda t: t.normal_(-1.0, 1.0),
                TensorSupplyType.Randn: lambda t: t.normal_(0.0, 1.0)}


def _integer_like(shape: tuple, dtype: torch.dtype, device: torch.device,
                  floats_uniform: bool) -> torch.Tensor:
    """Auto's and Integer's draws (they differ only for fp16/bf16/fp32: uniform under Auto)."""
    if dtype in _UNSIGNED:
        return torch.randint(0, 3, shape, dtype=dtype, device=device)
    if dtype in _FP8:
        return torch.randint(-128, 128, shape, dtype=torch.int8, device=device).to(dtype)
    if dtype == torch.bool:
        return torch.randint(0, 2, shape, dtype=dtype, device=device)
    if floats_uniform and dtype in _UNIFORM_UNDER_AUTO:
        return torch.empty(shape, dtype=dtype, device=device).uniform_(-1.0, 1.0)
    return torch.randint(-2, 3, shape, dtype=dtype, device=device)
