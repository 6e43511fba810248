"""Arguments in, outputs out: maps a call's arguments to the kernel's parameters, checks them once
(``lowering.arguments``: the kernel's parameters plus the loaded program's ``ArgumentRules``;
``TypeError``/``ValueError`` naming the parameter), resolves runtime dims, allocates ``out_idx``
outputs on the inputs' device (returned in ``out_idx`` order), and lists the values in
``kernel.params`` order for the launcher."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence, Union

import torch

from tilews.lowering import ir
from tilews.lowering.arguments import ArgumentChecker, ArgumentRules
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
        dims = self.checker.check([(p.param, a) for p, a in zip(self.inputs, args)])
        values: dict[str, object] = {p.param.name: a for p, a in zip(self.inputs, args)}
        for v, size in dims.items():
            values.setdefault(v.name, size)
        device = next((a.device for a in args if isinstance(a, torch.Tensor)), None)
        outs = []
        for i in self.out_positions:
            p = self.params[i]
            shape = [ir.as_int(d) if ir.as_int(d) is not None else values[d.name] for d in p.param.shape]
            t = torch.empty(shape, dtype=p.param.dtype.torch_dtype, device=device or "cpu")
            if self.poison:
                poison_(t)
            values[p.param.name] = t
            outs.append(t)
        return [values[q.name] for q in self.kernel.params], outs
