"""Kernel arguments against the kernel's parameters: the one argument check of every call.

``ArgumentChecker(kernels, rules).check(pairs)`` (``kernels``: those launched with one argument
list, a function's in order) takes (parameter, argument) pairs — a torch tensor
of the parameter's dtype and shape for each buffer, a Python number of the right kind for each
runtime scalar — and raises ``TypeError`` / ``ValueError`` naming the parameter. It returns the
value of every runtime dimension (``Var``) the tensors bind. ``rules`` add what the loaded program
needs (``ArgumentRules``: a device type, bulk-copy alignment). The runtime's binder checks a call's
inputs with it once; launchers receive checked values and check nothing.
``check(kernel, args, rules)`` checks a whole argument list aligned with ``kernel.params``.

Besides each argument on its own, the checker rejects a tensor the kernel writes whose memory
overlaps another tensor argument (an output aliasing an input or another output): the element spans
``[data_ptr, data_ptr + (sum((size - 1) * stride) + 1) * itemsize)`` are compared, so two disjoint
but interleaved views of one tensor are reported too. Reading one tensor through two parameters is
fine. Tensors must hold data on a device tilews runs on (``DEVICE_TYPES``; never ``meta``), and a
runtime scalar must fit its dtype (an int in its range, a float within its finite range).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional, Sequence, Union

from . import ir
from .errors import InternalError
from .traverse import buffers_written, walk


@dataclass(frozen=True)
class ArgumentRules:
    """What a program needs of its arguments beyond the kernel's parameters."""
    device: Optional[str] = None                  # every tensor on this device type ("cuda")
    bulk_copy: frozenset[str] = frozenset()       # tensors a bulk (TMA) copy reads or writes:
                                                  # 16-byte aligned base and outer strides, unit
                                                  # stride in the last dimension

    @staticmethod
    def of_all(rules: Sequence["ArgumentRules"]) -> "ArgumentRules":
        """What programs launched with one argument list (a function's kernels) need: what each
        of them needs."""
        devices = {r.device for r in rules} - {None}
        if len(devices) > 1:
            raise InternalError(f"one function's kernels run on devices {sorted(devices)}")
        return ArgumentRules(next(iter(devices), None), frozenset().union(*(r.bulk_copy for r in rules)))


Param = Union[ir.Buffer, ir.Var]

DEVICE_TYPES = ("cpu", "cuda", "mps")   # torch device types a kernel's tensors may be on (ROCm is "cuda")


class ArgumentChecker:
    def __init__(self, kernels: Sequence[ir.Kernel], rules: ArgumentRules = ArgumentRules()):
        self.rules = rules
        self.written = {b for k in kernels for s in walk(k.body) for b in buffers_written(s)}

    def check(self, pairs: Sequence[tuple[Param, object]]) -> dict[ir.Var, int]:
        dims: dict[ir.Var, tuple[int, str]] = {}
        device = None
        tensors = []
        for p, a in pairs:
            if isinstance(p, ir.Var):
                check_scalar(p, a)
                continue
            self._tensor(p, a, dims)
            if device is None:
                device = a.device
            elif a.device != device:
                raise ValueError(f"parameter '{p.name}' is on {a.device} but earlier tensors are "
                                 f"on {device}")
            tensors.append((p, a))
        self._overlaps(tensors)
        return {v: size for v, (size, _) in dims.items()}

    def _overlaps(self, tensors: list) -> None:
        """A written tensor must not share memory with any other tensor argument."""
        spans = [(b, span(a)) for b, a in tensors if a.numel() > 0]
        for i, (b, here) in enumerate(spans):
            for c, there in spans[:i]:
                if (b in self.written or c in self.written) and spans_overlap(here, there):
                    written = [x.name for x in (c, b) if x in self.written]
                    what = "both" if len(written) == 2 else f"'{written[0]}'"
                    raise ValueError(f"parameters '{c.name}' and '{b.name}' overlap in memory, and "
                                     f"the kernel writes {what}; pass separate tensors (an output "
                                     f"must not alias an input or another output)")

    def _tensor(self, b: ir.Buffer, a, dims: dict) -> None:
        import torch
        if not isinstance(a, torch.Tensor):
            raise TypeError(f"parameter '{b.name}' must be a torch.Tensor, got {type(a).__name__}")
        if a.device.type not in DEVICE_TYPES:
            held = ("which holds no data" if a.device.type == "meta"
                    else "which tilews does not run on")
            kinds = [t.upper() for t in DEVICE_TYPES]
            raise ValueError(f"parameter '{b.name}' is on device {a.device}, {held}; pass a "
                             f"{', '.join(kinds[:-1])} or {kinds[-1]} tensor")
        want = b.dtype.torch_dtype
        if a.dtype != want:
            raise TypeError(f"parameter '{b.name}' has dtype {a.dtype}, expected {want}")
        if a.dim() != len(b.shape):
            raise ValueError(f"parameter '{b.name}' has {a.dim()} dimensions (shape "
                             f"{tuple(a.shape)}), expected {len(b.shape)}")
        for d, (size, dim) in enumerate(zip(a.shape, b.shape)):
            static = ir.as_int(dim)
            if static is not None and size != static:
                raise ValueError(f"parameter '{b.name}' has shape {tuple(a.shape)}, expected "
                                 f"{shape_text(b)} (dimension {d} is {size}, not {static})")
            if isinstance(dim, ir.Var):
                seen = dims.setdefault(dim, (size, b.name))
                if seen[0] != size:
                    raise ValueError(f"dimension {d} of '{b.name}' is {size}, but '{dim.name}' is "
                                     f"{seen[0]} from '{seen[1]}'")
        if b in self.written and a.numel() > 1 and 0 in a.stride():
            raise ValueError(f"parameter '{b.name}' is written by the kernel but has overlapping "
                             f"elements (a stride of 0); pass a contiguous tensor")
        if self.rules.device is not None and a.device.type != self.rules.device:
            raise ValueError(f"parameter '{b.name}' must be a {self.rules.device.upper()} tensor, "
                             f"got device {a.device}")
        if b.name in self.rules.bulk_copy:
            item = a.element_size()
            if a.data_ptr() % 16 or a.stride()[-1] != 1 or any(s * item % 16 for s in a.stride()[:-1]):
                raise ValueError(f"parameter '{b.name}' must have a 16-byte aligned address, unit "
                                 f"stride in its last dimension and 16-byte aligned other strides "
                                 f"(a bulk-copy operand); got strides {list(a.stride())}")


def check(kernel: ir.Kernel, args: Sequence, rules: ArgumentRules = ArgumentRules()) -> dict[ir.Var, int]:
    """Check ``args`` aligned with ``kernel.params``; the runtime dims they bind."""
    if len(args) != len(kernel.params):
        raise TypeError(f"kernel '{kernel.name}' takes {len(kernel.params)} argument(s) "
                        f"({', '.join(p.name for p in kernel.params)}), got {len(args)}")
    dims = ArgumentChecker((kernel,), rules).check(list(zip(kernel.params, args)))
    scalars = {p: a for p, a in zip(kernel.params, args) if isinstance(p, ir.Var)}
    for v, size in dims.items():
        if v in scalars and scalars[v] != size:
            raise ValueError(f"parameter '{v.name}' is {scalars[v]}, but the tensors' shapes make "
                             f"it {size}")
    return dims


def check_scalar(p: ir.Var, a) -> None:
    if p.dtype is ir.DType.BOOL:
        ok, what = isinstance(a, bool), "a bool"
    elif p.dtype.is_float:
        ok, what = isinstance(a, (int, float)) and not isinstance(a, bool), "a number"
    else:
        ok, what = isinstance(a, int) and not isinstance(a, bool), "an int"
    if not ok:
        raise TypeError(f"parameter '{p.name}' must be {what}, got {type(a).__name__}")
    if p.dtype.is_int:
        lo, hi = int_range(p.dtype)
        if not lo <= a <= hi:
            raise ValueError(f"parameter '{p.name}' is {a}, outside the range of {p.dtype!r} "
                             f"[{lo}, {hi}]")
    elif p.dtype.is_float:
        big, limit = float_limit(p.dtype)
        try:
            value = float(a)
        except OverflowError:                 # an int beyond every float
            value = math.inf
        if math.isinf(value) and isinstance(a, float):
            return                            # an explicit inf is the caller's choice
        if abs(value) >= limit:
            raise ValueError(f"parameter '{p.name}' is {a!r}, outside the finite range of "
                             f"{p.dtype!r} (magnitude at most {big!r}); it would overflow")


def spans_overlap(a: tuple[int, int], b: tuple[int, int]) -> bool:
    """Whether two (first byte, one past the last byte) spans share a byte."""
    return a[0] < b[1] and b[0] < a[1]


def span(t) -> tuple[int, int]:
    """The addresses a non-empty tensor's elements lie in: (first byte, one past the last byte).
    The checker compares spans only of tensors on one device."""
    lo = hi = t.data_ptr()
    for size, stride in zip(t.shape, t.stride()):
        reach = (size - 1) * stride * t.element_size()
        lo, hi = (lo + reach, hi) if reach < 0 else (lo, hi + reach)
    return lo, hi + t.element_size()


def int_range(dt: ir.DType) -> tuple[int, int]:
    """The values an integer dtype holds."""
    bits = dt.bits
    return (0, 2 ** bits - 1) if dt.record.kind == "uint" else (-2 ** (bits - 1), 2 ** (bits - 1) - 1)


def float_limit(dt: ir.DType) -> tuple[float, float]:
    """(the largest finite value of a float dtype, the magnitude from which a value rounds past
    it): the largest value plus half its ulp (round to nearest even takes that tie up where the
    largest value has an odd significand, as in the IEEE formats; it is treated as overflow for
    every dtype)."""
    import torch
    info = torch.finfo(dt.torch_dtype)
    if dt is ir.DType.F64:
        return info.max, math.inf
    _, exp = math.frexp(info.max)
    return info.max, info.max + math.ldexp(info.eps, exp - 2)


def shape_text(b: ir.Buffer) -> str:
    return "(" + ", ".join(str(ir.as_int(d)) if ir.as_int(d) is not None else d.name
                           for d in b.shape) + ")"
