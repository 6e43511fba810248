"""``@tilews.jit``: the two ways to write a kernel.

* Factory style (TileLang's): ``@tilews.jit(out_idx=[-1])`` on a function that returns a
  ``@T.prim_func``; calling the factory with its (hashable) arguments builds and compiles once per
  argument set and returns a ``Kernel``.
* Direct style: ``@tilews.jit`` on the kernel function itself, whose tensor parameters are
  annotated ``T.Tensor[(dims), dtype]``. Dims are ints (checked), names (bound from the argument,
  part of the specialization key, visible in the body) or ``T.dynamic(name)`` (runtime, no
  recompilation). Unannotated parameters and ``int``/``float``/``bool`` ones are build-time
  constants (part of the key); ones annotated with a dtype are runtime scalars. Calling it with
  torch tensors specializes, compiles (cached) and launches.
"""
from __future__ import annotations

import inspect
from typing import Any, Callable, Optional, Sequence

from tilews.lowering import ir
from tilews.lowering.frontend import KernelSource, kernel_source, semantic

from . import backends, targets
from .compiler import compile_kernel
from .kernel import Kernel
from .targets import TARGET_NAMES

def jit(fn: Optional[Callable] = None, *, out_idx: Optional[Sequence[int] | int] = None,
        target: str = "auto", **options):
    """Compile a tile-language kernel (see the module docstring). ``options`` go to the backend
    (interpreter: ``seed``, ``accumulate_f64``)."""
    if target not in TARGET_NAMES:
        raise ValueError(f"tilews.jit(target=...) must be one of {', '.join(TARGET_NAMES)}; got {target!r}")
    if options:
        _check_options(target, options)
    outs = [out_idx] if isinstance(out_idx, int) else list(out_idx or ())

    def wrap(f):
        if isinstance(f, KernelSource):
            return compile_kernel(f, target_name=target, out_idx=outs, options=options)
        if _is_direct(f):
            return DirectKernel(f, outs, target, options)
        return KernelFactory(f, outs, target, options)
    return wrap if fn is None else wrap(fn)


def _check_options(target: str, options: dict) -> None:
    """Backend options the target's backends do not take are a ``TypeError`` listing those they
    do."""
    resolved, _ = targets.resolve(target)
    valid = backends.option_names(resolved)
    unknown = sorted(set(options) - valid)
    if unknown:
        which = f"target '{target}'" + (f" (here '{resolved}')" if resolved != target else "")
        takes = f"takes {', '.join(sorted(valid))}" if valid else "takes no options"
        raise TypeError(f"tilews.jit() got unknown option(s) {', '.join(unknown)}; {which} "
                        f"{takes}")


def _annotations(f: Callable) -> dict[str, Any]:
    sig = inspect.signature(f, eval_str=True)
    return {n: p.annotation for n, p in sig.parameters.items()}


def _is_direct(f: Callable) -> bool:
    return any(isinstance(a, semantic.TensorSpec) for a in _annotations(f).values())


class KernelFactory:
    """Factory style: ``factory(*args)`` -> compiled ``Kernel`` (cached per argument set)."""

    def __init__(self, fn: Callable, out_idx: list[int], target: str, options: dict):
        self.fn, self.out_idx, self.target, self.options = fn, out_idx, target, options
        self._kernels: dict = {}
        self.__doc__, self.__name__ = fn.__doc__, fn.__name__

    def __call__(self, *args, **kwargs) -> Kernel:
        try:
            key = (args, tuple(sorted(kwargs.items())))
            hash(key)
        except TypeError:
            key = None
        if key is not None and key in self._kernels:
            return self._kernels[key]
        prim = self.fn(*args, **kwargs)
        if not isinstance(prim, KernelSource):
            raise TypeError(f"'{self.fn.__name__}' must return a @T.prim_func kernel, got "
                            f"{type(prim).__name__}")
        k = compile_kernel(prim, target_name=self.target, out_idx=self.out_idx, options=self.options)
        if key is not None:
            self._kernels[key] = k
        return k


class DirectKernel:
    """Direct style: ``kernel(*tensors)`` specializes on dtypes, named dims and constants."""

    def __init__(self, fn: Callable, out_idx: list[int], target: str, options: dict):
        self.fn, self.out_idx, self.target, self.options = fn, out_idx, target, options
        self.src = kernel_source(fn)
        sig = inspect.signature(fn, eval_str=True)
        self.params = list(sig.parameters.values())
        # out_idx indexes the runtime parameters (tensors and runtime scalars), not constants.
        self.runtime = [p for p in self.params if _is_runtime(p)]
        n = len(self.runtime)
        for i in out_idx:
            if not -n <= i < n:
                raise ValueError(f"out_idx {i} is out of range for a kernel with {n} tensor/scalar "
                                 f"parameters")
        self.outputs = {self.runtime[i % n].name for i in out_idx}
        self._kernels: dict = {}
        self.__doc__, self.__name__ = fn.__doc__, fn.__name__

    def __call__(self, *args, **constants):
        key, specs, names = self._specialize(args, constants)
        k = self._kernels.get(key)
        if k is None:
            k = compile_kernel(self.src, target_name=self.target, out_idx=self.out_idx,
                               param_specs=specs, extra_names=names, options=self.options,
                               user_params=[p.name for p in self.runtime])
            self._kernels[key] = k
        return k(*self._runtime_args(args))

    def _inputs(self):
        return [p for p in self.params if p.name not in self.outputs]

    def _runtime_args(self, args):
        return [a for p, a in zip(self._inputs(), args) if _is_runtime(p)]

    def _specialize(self, args, constants):
        ins = self._inputs()
        if len(args) > len(ins):
            raise TypeError(f"'{self.fn.__name__}' takes {len(ins)} argument(s), got {len(args)}")
        specs: dict[str, Any] = {}
        names: dict[str, int] = {}
        key: list = []
        given = dict(zip([p.name for p in ins], args))
        for p in self.params:
            ann = p.annotation
            if isinstance(ann, semantic.TensorSpec):
                if p.name in given and not hasattr(given[p.name], "shape"):
                    raise TypeError(f"parameter '{p.name}' must be a torch.Tensor, got "
                                    f"{type(given[p.name]).__name__}")
                if p.name not in given and p in ins:
                    raise TypeError(f"missing argument '{p.name}'")
                specs[p.name] = self._tensor_spec(p.name, ann, given.get(p.name), names)
                key.append((p.name, ann.dtype))
            elif isinstance(ann, ir.DType):
                if p.name not in given:
                    raise TypeError(f"missing argument '{p.name}'")
                specs[p.name] = ann
            else:
                if p.name in constants:
                    value = constants[p.name]
                elif p.name in given:
                    value = given[p.name]
                elif p.default is not inspect.Parameter.empty:
                    value = p.default
                else:
                    raise TypeError(f"missing argument '{p.name}'")
                specs[p.name] = value
                key.append((p.name, repr(value)))
        unknown = set(constants) - {p.name for p in self.params}
        if unknown:
            raise TypeError(f"unexpected keyword argument(s) {sorted(unknown)}")
        key.append(tuple(sorted(names.items())))
        return tuple(key), specs, names

    def _tensor_spec(self, name: str, ann: semantic.TensorSpec, tensor, names: dict):
        shape = []
        for d_i, d in enumerate(ann.shape):
            if isinstance(d, str):
                if tensor is None:
                    if d not in names:
                        raise ValueError(f"output '{name}': dimension '{d}' is not bound by any input")
                    shape.append(names[d])
                    continue
                size = int(tensor.shape[d_i]) if d_i < tensor.dim() else None
                if size is None:
                    raise ValueError(f"parameter '{name}' has {tensor.dim()} dimensions, expected "
                                     f"{len(ann.shape)}")
                if size == 0:
                    raise ValueError(f"parameter '{name}' has size 0 in dimension {d_i} ({d} = 0); "
                                     f"a named dimension must be positive (declare it "
                                     f"T.dynamic({d!r}) to accept empty tensors)")
                if names.setdefault(d, size) != size:
                    raise ValueError(f"dimension {d_i} of '{name}' is {size}, but '{d}' is "
                                     f"{names[d]} from an earlier argument")
                shape.append(size)
            else:
                shape.append(d)
        return semantic.TensorSpec(tuple(shape), ann.dtype)


def _is_runtime(p: inspect.Parameter) -> bool:
    return isinstance(p.annotation, (semantic.TensorSpec, ir.DType))
