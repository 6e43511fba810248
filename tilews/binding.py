"""Arguments in, outputs out: maps a call's arguments to the kernel's parameters, checks them
(``lowering.arguments``: the kernel's parameters plus the loaded program's ``ArgumentRules``;
``TypeError``/``ValueError`` naming the parameter), resolves runtime dims, allocates ``out_idx``
outputs on the inputs' device (returned in ``out_idx`` order), finds the function's workspaces
(``ir.Function.scratch``, ``T.alloc_global``: passed to its kernels, never returned), and lists the
values in ``function.params`` order for the launcher (every kernel of the function takes the same
list).

Workspaces are kept per binder, by (the device and its current stream, their shapes): a call
reuses those of an earlier call with the same shapes on the same stream (launches on one stream
run in order, so the earlier call's kernels are done with them), and a call on another stream gets
its own (calls on two streams may run at once). On the CPU and on MPS there is one stream per
device. A workspace starts uninitialized (as NaN where outputs are poisoned) and holds what the
last call left in it.

The full check runs once per call signature (each tensor's dtype, shape, strides and device;
each scalar's type) and leaves a ``BoundSignature`` (the runtime dims, the outputs' shapes, the
tensors' spans) and that signature's own bind function, generated with what the signature fixes
spelled as constants. A call with a known signature only re-checks what the signature does not
fix: bulk-copy operands' 16-byte alignment, memory overlap of an input the
kernel writes with the other tensor arguments (their addresses against spans the signature fixes;
the full check, to name them, only when two overlap), and the scalars' values. Signatures are
kept per binder, at most ``SIGNATURES``. A caller that already keys its own cache on (at least)
the signature takes ``bound(args)``: the same binding with the signature's key and look-up done
once, not per call."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional, Sequence, Union

SIGNATURES = 256      # call signatures a binder remembers (then it starts over)

import torch

from tilews.lowering import ir
from tilews.lowering.arguments import ArgumentChecker, ArgumentRules, check_scalar, span
from tilews.testing import poison_


@dataclass(frozen=True)
class UserParam:
    """A parameter as the user's function declares it."""
    name: str
    param: Union[ir.Buffer, ir.Var]


def stream_key(device: torch.device) -> tuple:
    """What tells apart the streams calls on ``device`` may run on concurrently: the current CUDA
    stream there; on other devices, the device alone."""
    if device.type == "cuda":     # the stream's handle, as torch.cuda.current_stream(device).cuda_stream
        return device, torch._C._cuda_getCurrentRawStream(device.index)
    return (device,)


class Binder:
    def __init__(self, function: ir.Function, user_params: Sequence[str], out_idx: Sequence[int] = (),
                 rules: ArgumentRules = ArgumentRules(), poison: bool = False):
        by_name = {p.name: p for p in function.params}
        missing = [n for n in user_params if n not in by_name]
        if missing:
            raise ValueError(f"internal: parameters {missing} have no IR counterpart")
        self.function = function
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
        # what each call allocates: the outputs (in out_idx order); and the workspaces, kept
        self.allocated = [self.params[i].param for i in self.out_positions]
        self.scratch = list(function.scratch)
        self.checker = ArgumentChecker(function.kernels, rules)
        # TILEWS_POISON_OUTPUTS (the tests set it): allocated outputs (and workspaces, when
        # allocated) start as NaN, so an element the kernel never writes cannot pass a check.
        self.poison = poison
        self._check_allocations_resolvable()
        # the runtime dims no argument passes, in parameter order
        where = {p.param.name for p in self.inputs} | {b.name for b in self.allocated + self.scratch}
        self._dims = [q for q in function.params if q.name not in where]
        self.signatures: dict[tuple, Callable] = {}   # key -> the signature's bind (_bind_of)
        self.workspaces: dict[tuple, list[torch.Tensor]] = {}   # (stream_key, shapes) -> tensors
        self._fast, self._signature = self._compile_fast_bind()

    def _check_allocations_resolvable(self) -> None:
        known = {d for p in self.inputs if isinstance(p.param, ir.Buffer) for d in p.param.shape
                 if isinstance(d, ir.Var)}
        known |= {p.param for p in self.inputs if isinstance(p.param, ir.Var)}
        for b in self.allocated + self.scratch:
            for d in b.shape:
                if isinstance(d, ir.Var) and d not in known:
                    what = "scratch buffer" if b in self.scratch else "output"
                    raise ValueError(f"{what} '{b.name}' has runtime dimension '{d.name}' that no "
                                     f"input determines")

    @property
    def input_names(self) -> list[str]:
        return [p.name for p in self.inputs]

    def bind(self, args: Sequence) -> tuple[list, list[torch.Tensor]]:
        """(values in ``kernel.params`` order, allocated outputs)."""
        if len(args) != len(self.inputs):
            raise TypeError(f"kernel '{self.function.name}' takes {len(self.inputs)} argument(s) "
                            f"({', '.join(self.input_names)}), got {len(args)}")
        try:
            return self._fast(*args)
        except (AttributeError, TypeError):    # an argument of the wrong kind: say which
            self._check(args)
            raise

    def bound(self, args: Sequence) -> Callable[..., tuple[list, list[torch.Tensor]]]:
        """``bind`` for calls whose arguments have ``args``'s signature (found, or fully checked
        now): a function of the arguments returning what ``bind`` returns, that neither computes
        nor looks up their signature; it still runs the checks a signature leaves open. The caller
        keys it on at least the signature (each tensor's dtype, shape, strides and device, each
        scalar's type) and calls it only with arguments of that signature."""
        if len(args) != len(self.inputs):
            raise TypeError(f"kernel '{self.function.name}' takes {len(self.inputs)} argument(s) "
                            f"({', '.join(self.input_names)}), got {len(args)}")
        try:
            return self._signature(*args)
        except (AttributeError, TypeError):    # an argument of the wrong kind: say which
            self._check(args)
            raise

    def _check(self, args: Sequence) -> dict:
        """The full check of one call's inputs; the runtime dims they bind."""
        return self.checker.check([(p.param, a) for p, a in zip(self.inputs, args)])

    def _compile_fast_bind(self):
        """The functions finding one call's signature, spelled out for this kernel's parameters
        (no loops over parameters per call): ``bind(*args)`` makes the signature's key, finds
        the signature's own bind function (a new signature: the full check, ``_first_bind``) and
        calls it; ``signature(*args)`` only finds that function."""
        names = [f"a{i}" for i in range(len(self.inputs))]
        key = [f"{a}.dtype, {a}.shape, {a}.stride(), {a}.device" if isinstance(p.param, ir.Buffer)
               else f"type({a})" for a, p in zip(names, self.inputs)]
        params = ", ".join(names)
        call = f"({params}{',' if len(names) == 1 else ''})"
        find = [f"    key = ({', '.join(key)}{',' if len(key) == 1 else ''})",
                "    known = signatures.get(key)",
                "    if known is None:",
                f"        known = first_bind(key, {call})"]
        source = [f"def bind({params}):", *find, f"    return known({params})",
                  f"def signature({params}):", *find, "    return known"]
        scope = {"signatures": self.signatures, "first_bind": self._first_bind}
        exec("\n".join(source), scope)
        return scope["bind"], scope["signature"]

    def _bind_of(self, sig: BoundSignature) -> Callable[..., tuple[list, list[torch.Tensor]]]:
        """The bind function of the arguments of signature ``sig``, what it fixes spelled as
        constants: it runs the checks a signature leaves open (each address read once; the
        overlap of a written input with another tensor as two comparisons of addresses, the
        spans' offsets constants; the full check, to name them, only when one fails), then makes
        the outputs and the values."""
        names = [f"a{i}" for i in range(len(self.inputs))]
        tensors = [i for i, p in enumerate(self.inputs) if isinstance(p.param, ir.Buffer)]
        written = [i for i in tensors if self.inputs[i].param in self.checker.written]
        pairs = [(i, j) for i in written for j in tensors
                 if j != i and not (j in written and j < i) and sig.spans[i] and sig.spans[j]]
        aligned = [i for i in tensors if self.inputs[i].name in self.checker.rules.bulk_copy]
        read = sorted({*aligned, *(k for pair in pairs for k in pair)})
        lines = [f"    p{i} = {names[i]}.data_ptr()" for i in read]
        # spans (first, end) at offsets from the address: a and b overlap iff each starts before
        # the other ends
        recheck = [f"p{i} % 16" for i in aligned]
        recheck += [f"(p{i} + {sig.spans[i][0]} < p{j} + {sig.spans[j][1]} and "
                    f"p{j} + {sig.spans[j][0]} < p{i} + {sig.spans[i][1]})" for i, j in pairs]
        params = ", ".join(names)
        if recheck:
            lines += [f"    if {' or '.join(recheck)}:",
                      f"        check(({params}{',' if len(names) == 1 else ''}))"]
        lines += [f"    check_scalar(inputs[{i}].param, {names[i]})" for i, p in enumerate(self.inputs)
                  if not isinstance(p.param, ir.Buffer)]
        for j in range(len(self.allocated)):
            lines.append(f"    o{j} = empty({sig.outputs[j]}, dtype=dtypes[{j}], device=device)")
            if self.poison:
                lines.append(f"    poison_(o{j})")
        if self.scratch:
            lines.append("    w = workspaces(sig)")
        where = {p.param.name: names[i] for i, p in enumerate(self.inputs)}
        where.update({b.name: f"o{j}" for j, b in enumerate(self.allocated)})
        where.update({b.name: f"w[{j}]" for j, b in enumerate(self.scratch)})
        where.update({q.name: repr(d) for q, d in zip(self._dims, sig.dims)})
        outs = ", ".join(f"o{j}" for j in range(len(self.out_positions)))
        lines.append(f"    return [{', '.join(where[q.name] for q in self.function.params)}], [{outs}]")
        scope = {"sig": sig, "empty": torch.empty, "dtypes": sig.dtypes, "device": sig.device,
                 "poison_": poison_, "check_scalar": check_scalar, "inputs": self.inputs,
                 "check": self._check, "workspaces": self._workspaces}
        exec("\n".join([f"def bind({params}):", *lines]), scope)
        return scope["bind"]

    def _first_bind(self, key: tuple, args: tuple) -> Callable:
        """A call with a new signature (``key``, made by the bind function): the full check, then
        the signature's bind function (``_bind_of``) is remembered and returned."""
        dims = self._check(args)
        sizes = {v.name: size for v, size in dims.items()}
        device = next((a.device for a in args if isinstance(a, torch.Tensor)), None) or torch.device("cpu")

        def shape(b: ir.Buffer) -> tuple[int, ...]:
            return tuple(ir.as_int(d) if ir.as_int(d) is not None else sizes[d.name] for d in b.shape)
        spans = tuple(_offsets(a) for a in args)
        sig = BoundSignature(
            tuple(shape(b) for b in self.allocated), tuple(b.dtype.torch_dtype for b in self.allocated),
            device, tuple(sizes[q.name] for q in self._dims), spans,
            tuple(shape(b) for b in self.scratch))
        return remember(self.signatures, key, self._bind_of(sig))

    def _workspaces(self, sig: BoundSignature) -> list[torch.Tensor]:
        """The workspaces of a call of signature ``sig`` on the current stream (the module
        docstring): those an earlier call left, else new ones."""
        key = (stream_key(sig.device), sig.scratch)
        found = self.workspaces.get(key)
        if found is None:
            found = [torch.empty(shape, dtype=b.dtype.torch_dtype, device=sig.device)
                     for b, shape in zip(self.scratch, sig.scratch)]
            if self.poison:
                for t in found:
                    poison_(t)
            remember(self.workspaces, key, found)
        return found


def remember(cache: dict, key, value):
    """``cache[key] = value``, the cache emptied first where it holds ``SIGNATURES`` entries
    (it starts over); returns ``value``. The bound on every per-call-signature cache."""
    if len(cache) >= SIGNATURES:
        cache.clear()
    cache[key] = value
    return value


def _offsets(a) -> Optional[tuple[int, int]]:
    """Where a non-empty tensor's elements lie, as (first, one past the last) byte offsets from
    its ``data_ptr()``; None for an empty tensor or a scalar."""
    if not isinstance(a, torch.Tensor) or a.numel() == 0:
        return None
    ptr = a.data_ptr()
    lo, hi = span(a)
    return lo - ptr, hi - ptr


@dataclass(frozen=True)
class BoundSignature:
    """What one call signature fixes: the shapes and dtypes of the outputs a call allocates
    (``Binder.allocated``), their device, the
    values of the kernel's runtime dims that no argument passes (in parameter order), per
    input its span's byte offsets from ``data_ptr()`` (``_offsets``; None: empty or a scalar),
    and the shapes of the workspaces (``Binder.scratch``)."""
    outputs: tuple[tuple[int, ...], ...]
    dtypes: tuple[torch.dtype, ...]
    device: torch.device
    dims: tuple[int, ...]
    spans: tuple[Optional[tuple[int, int]], ...]
    scratch: tuple[tuple[int, ...], ...]
