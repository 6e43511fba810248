"""Arguments in, outputs out: checks every argument against the kernel's parameters before a
launch (``TypeError``/``ValueError`` naming the parameter), resolves runtime dims, allocates
``out_idx`` outputs on the inputs' device, and lists the values in ``kernel.params`` order."""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Optional, Sequence, Union

import torch

from tilews.testing import poison_

from tilews.lowering import arguments, ir
from tilews.lowering.arguments import TORCH_DTYPES
from tilews.lowering.traverse import buffers_written, walk

@dataclass(frozen=True)
class UserParam:
    """A parameter as the user's function declares it."""
    name: str
    param: Union[ir.Buffer, ir.Var]


class Binder:
    def __init__(self, kernel: ir.Kernel, user_params: Sequence[str], out_idx: Sequence[int] = ()):
        by_name = {p.name: p for p in kernel.params}
        missing = [n for n in user_params if n not in by_name]
        if missing:
            raise ValueError(f"internal: parameters {missing} have no IR counterpart")
        self.kernel = kernel
        self.params = [UserParam(n, by_name[n]) for n in user_params]
        n = len(self.params)
        outs = []
        for i in out_idx:
            if not -n <= i < n:
                raise ValueError(f"out_idx {i} is out of range for a kernel with {n} parameters")
            outs.append(i % n)
        for i in outs:
            if not isinstance(self.params[i].param, ir.Buffer):
                raise ValueError(f"out_idx names '{self.params[i].name}', which is not a tensor")
        self.out_positions = sorted(set(outs))
        self.inputs = [p for i, p in enumerate(self.params) if i not in self.out_positions]
        self.written = {b for s in walk(kernel.body) for b in buffers_written(s)}
        # TILEWS_POISON_OUTPUTS=1 (the tests set it): allocated outputs start as NaN, so an
        # element the kernel never writes cannot pass a check.
        self.poison = os.environ.get("TILEWS_POISON_OUTPUTS") == "1"
        self._check_outputs_resolvable()

    def _check_outputs_resolvable(self) -> None:
        known = {d for p in self.inputs if isinstance(p.param, ir.Buffer) for d in p.param.shape
                 if isinstance(d, ir.Var)}
        known |= {p.param for p in self.inputs if isinstance(p.param, ir.Var)}
        for i in self.out_positions:
            for d in self.params[i].param.shape:
                if isinstance(d, ir.Var) and d not in known:
                    raise ValueError(f"output '{self.params[i].name}' has runtime dimension "
                                     f"'{d.name}' that no input determines")

    @property
    def input_names(self) -> list[str]:
        return [p.name for p in self.inputs]

    def bind(self, args: Sequence) -> tuple[list, list[torch.Tensor]]:
        """(values in ``kernel.params`` order, allocated outputs)."""
        if len(args) != len(self.inputs):
            raise TypeError(f"kernel '{self.kernel.name}' takes {len(self.inputs)} argument(s) "
                            f"({', '.join(self.input_names)}), got {len(args)}")
        values: dict[str, object] = {}
        dims: dict[ir.Var, tuple[int, str]] = {}
        device: Optional[torch.device] = None
        for p, a in zip(self.inputs, args):
            if isinstance(p.param, ir.Buffer):
                self._check_tensor(p, a, dims)
                if device is None:
                    device = a.device
                elif a.device != device:
                    raise ValueError(f"parameter '{p.name}' is on {a.device} but earlier tensors are "
                                     f"on {device}")
            else:
                arguments.check_scalar(p.param, a)
            values[p.param.name] = a
        for v, (size, _) in dims.items():
            values.setdefault(v.name, size)
        outs = []
        for i in self.out_positions:
            p = self.params[i]
            shape = [ir.as_int(d) if ir.as_int(d) is not None else values[d.name] for d in p.param.shape]
            t = torch.empty(shape, dtype=TORCH_DTYPES[p.param.dtype], device=device or "cpu")
            if self.poison:
                poison_(t)
            values[p.param.name] = t
            outs.append(t)
        return [values[q.name] for q in self.kernel.params], outs

    def _check_tensor(self, p: UserParam, a, dims: dict) -> None:
        b = p.param
        if not isinstance(a, torch.Tensor):
            raise TypeError(f"parameter '{p.name}' must be a torch.Tensor, got {type(a).__name__}")
        want = TORCH_DTYPES[b.dtype]
        if a.dtype != want:
            raise TypeError(f"parameter '{p.name}' has dtype {a.dtype}, expected {want}")
        if a.dim() != len(b.shape):
            raise ValueError(f"parameter '{p.name}' has {a.dim()} dimensions (shape "
                             f"{tuple(a.shape)}), expected {len(b.shape)}")
        for d, (size, dim) in enumerate(zip(a.shape, b.shape)):
            static = ir.as_int(dim)
            if static is not None and size != static:
                raise ValueError(f"parameter '{p.name}' has shape {tuple(a.shape)}, expected "
                                 f"{_shape_text(b)} (dimension {d} is {size}, not {static})")
            if isinstance(dim, ir.Var):
                seen = dims.setdefault(dim, (size, p.name))
                if seen[0] != size:
                    raise ValueError(f"dimension {d} of '{p.name}' is {size}, but '{dim.name}' is "
                                     f"{seen[0]} from '{seen[1]}'")
        if b in self.written and a.numel() > 1 and 0 in a.stride():
            raise ValueError(f"parameter '{p.name}' is written by the kernel but has overlapping "
                             f"elements (a stride of 0); pass a contiguous tensor")


def _shape_text(b: ir.Buffer) -> str:
    return "(" + ", ".join(str(ir.as_int(d)) if ir.as_int(d) is not None else d.name for d in b.shape) + ")"
