"""``@tilews.jit``: the three ways to write a kernel.

* Factory style (TileLang's older one): ``@tilews.jit(out_idx=[-1])`` on a function that returns a
  ``@T.prim_func``; calling the factory with its (hashable) arguments builds and compiles once per
  argument set and returns a ``Kernel``.
* Eager style (TileLang's newer one, ``tilews.lowering.frontend.eager``): the function declares its
  tensors in its body (``A: T.Tensor((M, K), dtype)``), its specialized dims with ``T.const`` and
  its outputs with ``T.empty``, and returns the outputs. ``fn(a, b, block_M=...)`` compiles (once
  per build-time values and ``T.const`` values) and runs; ``fn.compile(M=..., block_M=...)``
  returns the ``Kernel``.
* Direct style: ``@tilews.jit`` on the kernel function itself, whose tensor parameters are
  annotated ``T.Tensor[(dims), dtype]``. Dims are ints (checked), names (bound from the argument,
  part of the specialization key, visible in the body) or ``T.dynamic(name)`` (runtime, no
  recompilation). Unannotated parameters and ``int``/``float``/``bool`` ones are build-time
  constants (part of the key); ones annotated with a dtype are runtime scalars. Calling it with
  torch tensors specializes, compiles (cached) and launches.

The three styles share one memo of compiled kernels (``JitFunction._kernel``), keyed by one
function, ``keys.specialization_key``, on values that hash by content (tensors by signature,
numbers and strings with their type, lists / tuples / dicts / sets element by element, dtypes;
other objects by their own hash): the factory's arguments by parameter name, the eager
style's build-time values, ``T.const`` values and target, the direct style's constants and
named dims. An argument with no hash is a ``TypeError`` naming it, but a factory call with one
compiles without the memo.

Every wrapper has ``mode``, ``fn``, ``param_names``, ``pass_configs``, ``compile(...)`` (-> a
``Kernel``) and ``with_pass_configs(extra)`` (the autotuner's interface); the eager and direct ones
also ``kernel_inputs(...)``: the call's arguments the compiled kernel takes.
"""
from __future__ import annotations

import functools
import inspect
import os
import sys
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Optional, Sequence

from tilews.lowering import ir
from tilews.lowering.errors import CompileError
from tilews.lowering.frontend import KernelSource, eager, kernel_source, semantic
from tilews.lowering.settings import Settings

from . import backends, compile_processes, keys, targets
from .compiler import BuildRequest, CompileConfig, compile_kernel
from .kernel import Kernel
from .targets import TARGET_NAMES

# TileLang's jit keywords that select its own toolchain; accepted so its programs run, no effect.
_TOOLCHAIN_KEYWORDS = ("execution_backend", "target_host", "verbose", "debug_root_path",
                       "compile_flags")


def jit(fn: Optional[Callable] = None, *, out_idx: Optional[Sequence[int] | int] = None,
        target: str = "auto", pass_configs: Optional[dict] = None, **options):
    """Compile a tile-language kernel (see the module docstring). ``pass_configs``: TileLang's
    compiler switches (``tilews.PassConfigKey``). ``options`` go to the backend (interpreter:
    ``seed``, ``accumulate_f64``); TileLang's toolchain keywords (``execution_backend``, ...) are
    accepted and have no effect."""
    if target not in TARGET_NAMES:
        raise ValueError(f"tilews.jit(target=...) must be one of {', '.join(TARGET_NAMES)}; got {target!r}")
    options = {k: v for k, v in options.items() if k not in _TOOLCHAIN_KEYWORDS}
    if options:
        _check_options(target, options)
    outs = [out_idx] if isinstance(out_idx, int) else list(out_idx or ())
    configs = dict(pass_configs or {})

    def wrap(f):
        if isinstance(f, KernelSource):
            return compile_kernel(BuildRequest.of(f, outs), CompileConfig(target, options, configs))
        if _is_eager(f):
            if outs:
                raise ValueError(f"'{function_name(f)}' declares its outputs with T.empty; out_idx is "
                                 f"for functions that return a @T.prim_func")
            return EagerKernel(f, outs, target, options, configs)
        if _is_direct(f):
            return DirectKernel(f, outs, target, options, configs)
        return KernelFactory(f, outs, target, options, configs)
    return wrap if fn is None else wrap(fn)


def compile(func: KernelSource, out_idx: Optional[Sequence[int] | int] = None, *,
            target: str = "auto", pass_configs: Optional[dict] = None, **options) -> Kernel:
    """TileLang's ``tilelang.compile``: the ``Kernel`` of a ``@T.prim_func`` (what a factory
    returns), compiled now; ``jit``'s keywords."""
    if not isinstance(func, KernelSource):
        raise TypeError(f"tilews.compile() takes a @T.prim_func; got {type(func).__name__} "
                        f"(decorate a factory with @tilews.jit instead)")
    return jit(func, out_idx=out_idx, target=target, pass_configs=pass_configs, **options)


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


def function_name(f: Callable) -> str:
    """The name of the function ``f`` calls: a ``functools.partial`` is named after the function
    it wraps (its bound arguments are fixed for the wrapper, so no part of a kernel's key)."""
    while isinstance(f, functools.partial):
        f = f.func
    return getattr(f, "__name__", type(f).__name__)


def _annotations(f: Callable) -> dict[str, Any]:
    sig = inspect.signature(f, eval_str=True)
    return {n: p.annotation for n, p in sig.parameters.items()}


def _is_direct(f: Callable) -> bool:
    return any(isinstance(a, semantic.TensorSpec) for a in _annotations(f).values())


def _is_eager(f: Callable) -> bool:
    try:
        return eager.is_eager(kernel_source(f).tree)
    except CompileError:   # no readable source: not a kernel body, so a factory
        return False


class JitFunction:
    """What the three styles share: the user's function, target, backend options, pass configs,
    and the memo of compiled kernels (``_kernel``: one key function, ``keys.specialization_key``;
    the styles differ only in the named values they key on and the ``BuildRequest`` of a miss)."""
    mode = ""

    def __init__(self, fn: Callable, out_idx: list[int], target: str, options: dict,
                 pass_configs: dict):
        self.fn, self.out_idx, self.target, self.options = fn, out_idx, target, options
        self.pass_configs = pass_configs
        self.param_names = list(inspect.signature(fn).parameters)
        self._kernels: dict = {}
        self.__doc__, self.__name__ = fn.__doc__, function_name(fn)
        self.__wrapped__ = fn

    def with_pass_configs(self, extra: dict):
        """The same function compiled with ``extra`` merged over this one's pass configs."""
        return type(self)(self.fn, self.out_idx, self.target, self.options,
                          {**self.pass_configs, **extra})

    def _kernel(self, values: dict[str, Any], request: Callable[[], BuildRequest],
                target: Optional[str] = None, memo: bool = True) -> Kernel:
        """The kernel specialized on ``values`` (named build-time values): from the memo, or
        compiled from ``request()`` for ``target`` (default: this function's) and remembered.
        An unhashable value is ``Unhashable`` naming it, unless ``memo`` is False: then such a
        call compiles without the memo (the factory style's documented behaviour)."""
        try:
            key = keys.specialization_key(values)
        except keys.Unhashable as e:
            if memo:
                raise TypeError(f"{self.__name__}(): {e}") from None
            key = None
        kernel = self._kernels.get(key) if key is not None else None
        if kernel is None:
            config = CompileConfig(target or self.target, self.options, self.pass_configs)
            kernel = compile_kernel(request(), config)
            if key is not None:
                self._kernels[key] = kernel
        return kernel

    def get_kernel_source(self, *args, **kwargs) -> str:
        return self.compile(*args, **kwargs).get_kernel_source()

    def par_compile(self, configs: Sequence, num_workers: Optional[int] = None) -> list[Kernel]:
        """``compile`` for each config (a dict of keywords or a tuple of positional arguments),
        in up to ``num_workers`` threads (``compile_each``); the kernels in the configs' order."""
        def one(c):
            return self.compile(**c) if isinstance(c, dict) else self.compile(*c)
        return compile_each(configs, one, num_workers)


def ast_is_thread_safe(version: tuple = tuple(sys.version_info[:3])) -> bool:
    """Whether ``ast.parse`` may run in several threads at once on this Python. Before 3.11.8 and
    3.12.2 its recursion counter was shared between threads (CPython gh-106905), so Triton parsing
    two kernels at once could fail with "SystemError: AST constructor recursion depth mismatch"."""
    if version[:2] == (3, 11):
        return version >= (3, 11, 8)
    if version[:2] == (3, 12):
        return version >= (3, 12, 2)
    return version >= (3, 13)


def compile_each(items: Sequence, compile_one: Callable, max_workers: Optional[int] = None) -> list:
    """``compile_one(item)`` for each item, the results in the items' order. The first compiles on
    this thread (Triton's first import is not safe from several threads at once), the others in
    up to ``max_workers`` threads (default: ``TILEWS_COMPILE_WORKERS``, else the CPU count); with
    one worker, or where this Python's ``ast`` is not thread-safe (``ast_is_thread_safe``), one
    after the other on this thread. With more than one worker, at least two items after the first
    and ``compile_processes.usable`` (``TILEWS_COMPILE_PROCESSES``), those are first built by
    that many forked children (``compile_processes.prebuild``) and then compiled here, their
    builds loaded from the artifact store. An exception of ``compile_one`` propagates (callers that go on past a failing
    item catch it per item, as the autotuner and the ops do).

    Shared state of concurrent compiles, and how it is guarded: the artifact store builds each key
    under a file lock and writes atomically (``tilews.cache``); the frontend's state is per thread
    (``frontend.context``); ``functools`` caches are thread-safe; Gluon's in-process Triton builds
    run one at a time (``triton_ext.passes.checking`` holds a lock: Triton's stage hook and cache
    folder are process-wide), as do its compile-server builds (one child per process). Why
    threads: ``tilews.autotuner.search``."""
    if not items:
        return []
    settings = Settings.from_env()
    if max_workers is None:
        max_workers = settings.compile_workers or os.cpu_count() or 1
    first = compile_one(items[0])
    if max_workers > 1 and len(items) > 2 and compile_processes.usable(settings):
        compile_processes.prebuild(items[1:], compile_one, max_workers)
    if max_workers == 1 or len(items) == 1 or not ast_is_thread_safe():
        return [first] + [compile_one(item) for item in items[1:]]
    with ThreadPoolExecutor(max_workers=min(max_workers, len(items) - 1)) as pool:
        return [first] + list(pool.map(compile_one, items[1:]))


class KernelFactory(JitFunction):
    """Factory style: ``factory(*args)`` -> compiled ``Kernel`` (cached per argument set)."""
    mode = "factory"

    def __init__(self, *a):
        super().__init__(*a)
        self.signature = inspect.signature(self.fn)
        self._calls: dict = {}        # keys.call_key -> the kernel (calls of flat values)

    def __call__(self, *args, **kwargs) -> Kernel:
        """Keyed on the arguments by parameter name, defaults applied (``f(1, n=2)`` and
        ``f(1, 2)`` are one key); unhashable ones compile without the memo. A call of flat values
        seen before is found by ``keys.call_key`` without binding."""
        quick = keys.call_key(args, kwargs)
        kernel = self._calls.get(quick) if quick is not None else None
        if kernel is not None:
            return kernel
        kernel = self._bound_call(args, kwargs)
        if quick is not None:
            self._calls[quick] = kernel
        return kernel

    def _bound_call(self, args: tuple, kwargs: dict) -> Kernel:
        try:
            bound = self.signature.bind(*args, **kwargs)
        except TypeError as e:
            raise TypeError(f"{self.__name__}(): {e}") from None
        bound.apply_defaults()

        def request() -> BuildRequest:
            prim = self.fn(*args, **kwargs)
            if not isinstance(prim, KernelSource):
                raise TypeError(f"'{self.__name__}' must return a @T.prim_func kernel, got "
                                f"{type(prim).__name__}")
            return BuildRequest.of(prim, self.out_idx)
        return self._kernel(dict(bound.arguments), request, memo=False)

    compile = __call__


class EagerKernel(JitFunction):
    """Eager style (see the module docstring). Parameters are runtime (declared in the body) or
    build-time; a keyword that is no parameter must be a ``T.const`` name (TileLang accepts any
    keyword silently; a misspelled one is an error here)."""
    mode = "eager"

    def __init__(self, *a):
        super().__init__(*a)
        self.signature = inspect.signature(self.fn)
        self._const_sources: dict = {}      # build-time values' key -> eager.ConstSources

    @functools.cached_property
    def src(self) -> KernelSource:
        """Parsed at the first compile, so module globals defined after the function are seen
        (as in TileLang, their values are frozen into each kernel, not part of its key)."""
        return kernel_source(self.fn)

    @functools.cached_property
    def eager_signature(self) -> eager.EagerSignature:
        return eager.signature(self.src)

    def __call__(self, *args, **kwargs):
        """Compile (cached) and run on the call's tensors: one output, a list, or ``[]``."""
        kernel, inputs = self._prepare(args, kwargs, need_inputs=True)
        out = kernel(*inputs)
        return [] if out is None else out

    def compile(self, *args, **kwargs) -> Kernel:
        """The kernel for these arguments, not run; tensors may be left out when every
        ``T.const`` is given by keyword. The kernel takes the runtime parameters only."""
        return self._prepare(args, kwargs, need_inputs=False)[0]

    def kernel_inputs(self, *args, **kwargs) -> list:
        """The call's arguments the compiled kernel takes (tensors and runtime scalars)."""
        return self._bind(args, kwargs, need_inputs=True)[2]

    def _prepare(self, args, kwargs, need_inputs: bool) -> tuple[Kernel, list]:
        constants, consts, inputs = self._bind(args, kwargs, need_inputs)
        target = self._target(inputs)
        sig, src = self.eager_signature, self.src

        def request() -> BuildRequest:
            def build(debug: bool, target: str) -> ir.Function:
                return eager.build_eager(src, constants, consts, sig, debug=debug, target=target)
            n_in = len(sig.runtime)
            return BuildRequest(build, sig.runtime + sig.outputs,
                                tuple(range(n_in, n_in + len(sig.outputs))))
        # T.const names are keyed apart from the parameters (one may share a parameter's name)
        values = {**constants, "T.const": consts, "<target>": targets.resolve(target)[0]}
        return self._kernel(values, request, target), inputs

    def _bind(self, args, kwargs, need_inputs: bool) -> tuple[dict, dict, list]:
        """(build-time values by parameter, T.const values, runtime arguments in order)."""
        sig = self.eager_signature
        extra = {k: v for k, v in kwargs.items() if k not in sig.params}
        unknown = sorted(k for k in extra if k not in sig.consts)
        if unknown:
            raise TypeError(f"{self.__name__}() got unexpected keyword argument(s) "
                            f"{', '.join(unknown)}; its parameters are {', '.join(sig.params)}"
                            + (f" and its T.const names {', '.join(sig.consts)}" if sig.consts else ""))
        try:
            bound = self.signature.bind_partial(*args, **{k: v for k, v in kwargs.items()
                                                          if k in sig.params})
        except TypeError as e:
            raise TypeError(f"{self.__name__}(): {e}") from None
        bound.apply_defaults()
        given = bound.arguments
        constants = {}
        for p in sig.params:
            if p in sig.runtime:
                continue
            if p not in given:
                raise TypeError(f"{self.__name__}() is missing the build parameter '{p}'")
            constants[p] = given[p]
        absent = [p for p in sig.runtime if p not in given]
        if need_inputs and absent:
            raise TypeError(f"{self.__name__}() is missing the argument(s) {', '.join(absent)}")
        found = self._sources(constants) if any(c not in extra for c in sig.consts) else None
        consts = {c: self._const_value(c, extra, given, found) for c in sig.consts}
        return constants, consts, [given[p] for p in sig.runtime if p in given]

    def _sources(self, constants: dict) -> eager.ConstSources:
        """Where the T.const values come from for these build-time values (the declarations run
        once per key)."""
        try:
            key = keys.specialization_key(constants)
        except keys.Unhashable:
            key = None
        found = self._const_sources.get(key) if key is not None else None
        if found is None:
            found = eager.const_sources(self.src, constants, self.eager_signature)
            if key is not None:
                self._const_sources[key] = found
        return found

    def _const_value(self, name: str, extra: dict, given: dict,
                     found: Optional[eager.ConstSources]) -> int:
        if name in extra:
            value = extra[name]
        else:
            source = found.sources.get(name)
            if source is None:
                why = (f"; the declarations could not run with T.const names as symbols: "
                       f"{found.failure}" if found.failure else "")
                raise ValueError(f"{self.__name__}(): no declared tensor determines T.const "
                                 f"'{name}' (no dimension is '{name}', or an integer multiple of "
                                 f"it plus a constant); give it by keyword ({name}=...){why}")
            tensor = given.get(source.param)
            if tensor is None:
                raise ValueError(f"{self.__name__}(): cannot find a value for T.const '{name}': "
                                 f"pass '{source.param}' or give {name}=...")
            if not hasattr(tensor, "shape") or len(tensor.shape) <= source.dim:
                raise ValueError(f"{self.__name__}(): '{source.param}' must be a tensor with at "
                                 f"least {source.dim + 1} dimensions (T.const '{name}' is read "
                                 f"from {source.describe(name)})")
            value = source.value(int(tensor.shape[source.dim]))
            if value is None:
                raise ValueError(f"{self.__name__}(): '{source.param}' has size "
                                 f"{int(tensor.shape[source.dim])} in dimension {source.dim}, "
                                 f"which is declared {source.describe(name)}: no positive "
                                 f"integer '{name}' gives it")
        if isinstance(value, bool) or not isinstance(value, int) and not hasattr(value, "__index__"):
            raise TypeError(f"{self.__name__}(): T.const '{name}' must be an int, got {value!r}")
        return int(value)

    def _target(self, inputs: list) -> str:
        """``"auto"`` follows the tensors: CPU tensors run on the interpreter."""
        if self.target != "auto":
            return self.target
        devices = {t.device.type for t in inputs if hasattr(t, "device")}
        return "interpret" if devices == {"cpu"} else "auto"


class DirectKernel(JitFunction):
    """Direct style: ``kernel(*tensors)`` specializes on dtypes, named dims and constants."""
    mode = "direct"

    def __init__(self, *a):
        super().__init__(*a)
        self.src = kernel_source(self.fn)
        sig = inspect.signature(self.fn, eval_str=True)
        self.params = list(sig.parameters.values())
        # out_idx indexes the runtime parameters (tensors and runtime scalars), not constants.
        self.runtime = [p for p in self.params if _is_runtime(p)]
        n = len(self.runtime)
        for i in self.out_idx:
            if not -n <= i < n:
                raise ValueError(f"out_idx {i} is out of range for a kernel with {n} tensor/scalar "
                                 f"parameters")
        self.outputs = {self.runtime[i % n].name for i in self.out_idx}

    def __call__(self, *args, **constants):
        return self.compile(*args, **constants)(*self.kernel_inputs(*args))

    def compile(self, *args, **constants) -> Kernel:
        """The kernel specialized for these arguments (tensors give dtypes and named dims)."""
        values, specs, names = self._specialize(args, constants)
        return self._kernel(values, lambda: BuildRequest.of(
            self.src, self.out_idx, specs, names, [p.name for p in self.runtime]))

    def kernel_inputs(self, *args, **_constants) -> list:
        """The call's arguments the compiled kernel takes (tensors and runtime scalars)."""
        return self._runtime_args(args)

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
        values: dict[str, Any] = {}     # the key's inputs: constants, and the named dims
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
                specs[p.name] = values[p.name] = value
        unknown = set(constants) - {p.name for p in self.params}
        if unknown:
            raise TypeError(f"unexpected keyword argument(s) {sorted(unknown)}")
        values["T.Tensor dims"] = names     # not an identifier: no parameter has this name
        return values, specs, names

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
