"""``Profiler``: a compiled kernel's inputs, checks and timings (TileLang's ``kernel.get_profiler()``).

Inputs are generated per ``TensorSupplyType`` (``supply.py``) with each non-output parameter's
shape and dtype, on the device the kernel runs on (``Kernel.device``). A runtime (``T.dynamic``)
dim or a runtime scalar parameter has no value to invent: it is a ``ValueError`` naming it unless
``dynamic_symbolic_constraints`` gives it (by name), or the caller passes ``input_tensors``.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Callable, Mapping, Optional, Sequence, Union

import torch

from .bench import do_bench as _do_bench
from .compare import assert_outputs_close
from .supply import TensorSupplyType, generate

if TYPE_CHECKING:
    from tilews.kernel import Kernel, KernelParam


class Profiler:
    """``func``: the kernel; ``params``: its parameters (``Kernel.params``); ``supply_type``."""

    def __init__(self, kernel: "Kernel", tensor_supply_type: TensorSupplyType = TensorSupplyType.Auto):
        try:
            self.supply_type = TensorSupplyType(tensor_supply_type)
        except ValueError:
            raise ValueError(f"tensor_supply_type must be a TensorSupplyType "
                             f"({', '.join(t.name for t in TensorSupplyType)}), got "
                             f"{tensor_supply_type!r}") from None
        self.func = kernel
        self.params: list[KernelParam] = kernel.params
        self.device: torch.device = kernel.device

    def __call__(self, *args):
        return self.func(*args)

    def supply(self, dynamic_symbolic_constraints: Optional[Mapping[str, int]] = None) -> list:
        """Fresh inputs, one per kernel input (the non-output parameters, in order): tensors by
        the supply type; ``dynamic_symbolic_constraints`` gives each runtime dim (by its name)
        and each runtime scalar parameter its value."""
        given = dict(dynamic_symbolic_constraints or {})
        inputs = [p for p in self.params if not p.is_output]
        scalars = [p.name for p in inputs if p.is_scalar() and p.name not in given]
        if scalars:
            raise ValueError(f"kernel '{self.func.name}': the profiler cannot generate runtime scalar "
                             f"parameter(s) {', '.join(scalars)}; give their values in "
                             f"dynamic_symbolic_constraints={{...}} or pass input_tensors=")
        dims = sorted({d for p in inputs for d in p.shape if isinstance(d, str) and d not in given})
        if dims:
            raise ValueError(f"kernel '{self.func.name}' has runtime (T.dynamic) dimension(s) "
                             f"{', '.join(dims)}; give their sizes in do_bench(dynamic_symbolic_constraints="
                             f"{{{', '.join(f'{d!r}: ...' for d in dims)}}}) or pass input_tensors=")
        return [given[p.name] if p.is_scalar() else
                generate([given[d] if isinstance(d, str) else d for d in p.shape], p.torch_dtype(),
                         self.supply_type, self.device)
                for p in inputs]

    def assert_allclose(self, reference_program: Callable, input_tensors: Optional[Sequence] = None,
                        atol: float = 1e-2, rtol: float = 1e-2, max_mismatched_ratio: float = 0.01) -> None:
        """Run ``reference_program(*inputs)`` and the kernel on the same inputs (``input_tensors``,
        else ``supply()``) and compare the outputs (``compare.py``): an ``AssertionError`` if their
        count, a shape, dtype or device differs, or more than ``max_mismatched_ratio`` of an
        output's elements lie outside ``atol``/``rtol``."""
        ins = list(input_tensors) if input_tensors is not None else self.supply()
        refs = reference_program(*ins)
        self._sync()
        outs = self.func(*ins)
        self._sync()
        assert_outputs_close(outs, refs, atol=atol, rtol=rtol, max_mismatched_ratio=max_mismatched_ratio)

    def do_bench(self, func: Optional[Callable] = None, warmup: float = 25, rep: float = 100,
                 n_warmup: int = 0, n_repeat: int = 0, input_tensors: Optional[Sequence] = None,
                 backend: str = "event", quantiles: Optional[Sequence[float]] = None,
                 return_mode: str = "mean",
                 dynamic_symbolic_constraints: Optional[Mapping[str, int]] = None,
                 device: Union[int, str, torch.device, None] = None,
                 early_stop_baseline: Optional[float] = None) -> Union[float, list[float]]:
        """Milliseconds per call of ``func`` (default: the kernel) on one set of inputs
        (``input_tensors``, else freshly generated). ``warmup``/``rep`` are millisecond budgets;
        ``n_warmup``/``n_repeat``, when > 0, iteration counts (``tilews.profiler.do_bench``)."""
        fn = func if func is not None else self.func
        ins = list(input_tensors) if input_tensors is not None else self.supply(dynamic_symbolic_constraints)
        return _do_bench(lambda: fn(*ins), warmup=warmup, rep=rep, _n_warmup=n_warmup,
                         _n_repeat=n_repeat, quantiles=quantiles, backend=backend,
                         return_mode=return_mode, device=device if device is not None else self.device,
                         early_stop_baseline=early_stop_baseline)

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize()
