"""Arguments in, outputs out: maps a call's arguments to the kernel's parameters, checks them
(``lowering.arguments``: the kernel's parameters plus the loaded program's ``ArgumentRules``;
``TypeError``/``ValueError`` naming the parameter), resolves runtime dims, allocates ``out_idx``
outputs on the inputs' device (returned in ``out_idx`` order), and lists the values in
``kernel.params`` order for the launcher.

The full check runs once per call signature (each tensor's dtype, shape, strides and device;
each scalar's type) and leaves a ``BoundSignature``: the runtime dims, the outputs' shapes and
where each launch value comes from. A call with a known signature only re-checks what the
signature does not fix: bulk-copy operands' 16-byte alignment, memory overlap when the kernel
writes an input, and the scalars' values. Signatures are kept per binder, at most
``SIGNATURES``."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence, Union

SIGNATURES = 256      # call signatures a binder remembers (then it starts over)

import torch

from tilews.lowering import ir
from tilews.lowering.arguments import ArgumentChecker, ArgumentRules, check_scalar
from tilews.testing import poison_


@dataclass(frozen=True)
class UserParam:
    """A parameter as the user's function declares it."""
    name: str
    param: Union[ir.Buffer, ir.Var]


class Binder:
    def __init__(self, kernel: ir.Kernel, user_params: Sequence[str], out_idx: Sequence[int] = (),
                 rules: ArgumentRules = ArgumentRules(), poison: bool = False):
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
        self.out_positions = list(dict.fromkeys(outs))   # in out_idx order, each once
        self.inputs = [p for i, p in enumerate(self.params) if i not in self.out_positions]
        self.checker = ArgumentChecker(kernel, rules)
        # TILEWS_POISON_OUTPUTS (the tests set it): allocated outputs start as NaN, so an element
        # the kernel never writes cannot pass a check.
        self.poison = poison
        self._check_outputs_resolvable()
        self.signatures: dict[tuple, BoundSignature] = {}
        self._aligned = [i for i, p in enumerate(self.inputs) if p.name in rules.bulk_copy]
        self._scalars = [(i, p.param) for i, p in enumerate(self.inputs) if isinstance(p.param, ir.Var)]
        # an input the kernel writes may alias another tensor argument: checked on every call
        self._writes_input = any(p.param in self.checker.written for p in self.inputs)

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
        key = tuple((a.dtype, a.shape, a.stride(), a.device) if isinstance(a, torch.Tensor)
                    else type(a) for a in args)
        sig = self.signatures.get(key)
        if sig is None:
            sig = self._bind_signature(args)
            if len(self.signatures) >= SIGNATURES:
                self.signatures.clear()
            self.signatures[key] = sig
        else:
            self._recheck(args)
        outs = []
        for shape, dtype in sig.outputs:
            t = torch.empty(shape, dtype=dtype, device=sig.device)
            if self.poison:
                poison_(t)
            outs.append(t)
        return [args[i] if where == "input" else outs[i] if where == "output" else i
                for where, i in sig.values], outs

    def _recheck(self, args: Sequence) -> None:
        """What a known signature does not fix: alignment, overlap, scalar values."""
        if any(args[i].data_ptr() % 16 for i in self._aligned) or self._writes_input:
            self.checker.check([(p.param, a) for p, a in zip(self.inputs, args)])
        for i, v in self._scalars:
            check_scalar(v, args[i])

    def _bind_signature(self, args: Sequence) -> "BoundSignature":
        dims = self.checker.check([(p.param, a) for p, a in zip(self.inputs, args)])
        sizes = {v.name: size for v, size in dims.items()}
        device = next((a.device for a in args if isinstance(a, torch.Tensor)), None) or torch.device("cpu")
        outputs = []
        for i in self.out_positions:
            b = self.params[i].param
            outputs.append((tuple(ir.as_int(d) if ir.as_int(d) is not None else sizes[d.name]
                                  for d in b.shape), b.dtype.torch_dtype))
        where = {p.param.name: ("input", i) for i, p in enumerate(self.inputs)}
        where.update({self.params[i].param.name: ("output", j) for j, i in enumerate(self.out_positions)})
        values = tuple(where.get(q.name) or ("dim", sizes[q.name]) for q in self.kernel.params)
        return BoundSignature(tuple(outputs), device, values)


@dataclass(frozen=True)
class BoundSignature:
    """What one call signature fixes: the outputs' (shape, dtype), their device, and for each
    kernel parameter where its launch value comes from: ("input", position in the call),
    ("output", position among the outputs) or ("dim", a runtime dim's value)."""
    outputs: tuple[tuple[tuple[int, ...], torch.dtype], ...]
    device: torch.device
    values: tuple[tuple[str, object], ...]
