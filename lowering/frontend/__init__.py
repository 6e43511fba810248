"""The frontend: a kernel function's Python source -> an ``ir.Function`` (its kernels).

``build_function`` parses the function's AST (Python values evaluated at build time, tile
operations recorded as IR) and is the entry point; ``build_kernel`` is the same for a function of
one ``T.Kernel`` block, returning that kernel. ``visitor`` handles syntax, ``semantic`` types and
shapes.
"""
from __future__ import annotations

import ast
import inspect
import textwrap
from dataclasses import dataclass
from typing import Any, Callable, Optional

from .. import ir
from ..errors import CompileError
from . import semantic
from .context import Builder, active
from .visitor import KernelVisitor


@dataclass
class KernelSource:
    """A kernel function with the names it sees (globals + closure, captured at definition)."""
    fn: Callable
    names: dict
    tree: ast.FunctionDef
    file: str
    line_offset: int
    col_offset: int = 0      # indentation removed before parsing

    @property
    def name(self) -> str:
        return self.fn.__name__

    @property
    def param_names(self) -> list[str]:
        return [a.arg for a in self.tree.args.args]

    @property
    def source(self) -> str:
        return ast.unparse(self.tree)


def kernel_source(fn: Callable, enclosing: Optional[dict] = None) -> KernelSource:
    """``enclosing``: the locals of the scope that defined ``fn`` (string annotations, under
    ``from __future__ import annotations``, may use names the body's closure does not hold)."""
    try:
        raw = inspect.getsource(fn)
        src = textwrap.dedent(raw)
        file = inspect.getsourcefile(fn) or "<unknown>"
    except (OSError, TypeError) as e:
        raise CompileError(f"cannot read the source of kernel '{getattr(fn, '__name__', fn)}': {e}; "
                           f"kernels must be defined in a file") from None
    tree = ast.parse(src)
    fdef = tree.body[0]
    if not isinstance(fdef, ast.FunctionDef):
        raise CompileError(f"'{fn.__name__}' is not a plain function")
    names = {**fn.__globals__, **(enclosing or {})}
    for var, cell in zip(fn.__code__.co_freevars, fn.__closure__ or ()):
        try:
            names[var] = cell.cell_contents
        except ValueError:  # an unbound cell: the name is defined later in the enclosing function
            pass
    indent = len(raw) - len(raw.lstrip(" \t")) - (len(src) - len(src.lstrip(" \t")))
    return KernelSource(fn, names, fdef, file, fn.__code__.co_firstlineno - 1, indent)


def build_kernel(src: KernelSource, param_specs: Optional[dict[str, Any]] = None,
                 extra_names: Optional[dict[str, Any]] = None, *, debug: bool = False,
                 target: str = "") -> ir.Kernel:
    """The kernel of a function of one ``T.Kernel`` block (``build_function``'s arguments); a
    ``CompileError`` for a function of several."""
    function = build_function(src, param_specs, extra_names, debug=debug, target=target)
    if len(function.kernels) > 1:
        raise CompileError(f"kernel function '{src.name}' has {len(function.kernels)} T.Kernel "
                           f"blocks; compile it with tilews.jit (build_function)", function.loc)
    return function.kernels[0]


def build_function(src: KernelSource, param_specs: Optional[dict[str, Any]] = None,
                   extra_names: Optional[dict[str, Any]] = None, *, debug: bool = False,
                   target: str = "") -> ir.Function:
    """Build the IR of ``src``. ``param_specs`` overrides annotations (direct style): a
    ``semantic.TensorSpec``, a DType (runtime scalar) or any Python value (bound as is).
    ``extra_names`` are visible in the body (direct style: shape symbols bound from arguments).
    ``debug`` (the ``TILEWS_DEBUG_FRONTEND`` setting) re-raises the raw error behind a
    ``CompileError``. ``target``: the name of the target the kernel is built for, read by
    operations that choose their own tiles (``T.fp8_scaled_matmul`` on global tensors)."""
    b = Builder(src.name, src.file)
    b.debug, b.target = debug, target
    v = KernelVisitor(b, {**src.names, **(extra_names or {})}, src.line_offset, src.col_offset,
                       debug=debug)
    with active(b):
        v._at(src.tree)
        args = src.tree.args
        if args.vararg or args.kwarg or args.kwonlyargs or args.posonlyargs:
            raise v.error("kernel functions take plain positional parameters only")
        for a in args.args:
            v._at(a)
            if param_specs is not None and a.arg in param_specs:
                spec = param_specs[a.arg]
            elif a.annotation is not None:
                # Python evaluated the annotation at definition, in the scope that saw every name
                # it uses (the body's closure may not hold them); only string annotations remain.
                ann = src.fn.__annotations__.get(a.arg)
                unevaluated = ann is None or (isinstance(ann, str) and not isinstance(ann, ir.DType))
                spec = v.eval(a.annotation) if unevaluated else ann
            else:
                raise v.error(f"parameter '{a.arg}' needs an annotation (T.Tensor(shape, dtype) or a "
                              f"scalar dtype)")
            v.bind(a.arg, _param_value(a.arg, spec, v))
        v.visit_body(src.tree.body)
        v._at(src.tree)
        return finish_function(b, src.name)


def finish_function(b: Builder, name: str) -> ir.Function:
    """The kernels ``b`` built, in order, each with every parameter (in creation order) and
    every scratch buffer of the function; an error at the current location when the function had
    no ``T.Kernel`` block. A function of one kernel names it after itself; of several,
    ``<name>_kernel<i>``. A kernel's notes are those recorded since the kernel before it closed
    (the last one also takes those recorded after it)."""
    if not b.kernels:
        raise CompileError(f"kernel '{name}' has no `with T.Kernel(...)` block", b.loc)
    several = len(b.kernels) > 1
    kernels, since = [], 0
    for i, k in enumerate(b.kernels):
        until = len(b.notes) if i == len(b.kernels) - 1 else k["notes_until"]
        kernels.append(ir.Kernel(
            f"{name}_kernel{i}" if several else name, tuple(b.params), k["grid"], k["block_vars"],
            k["threads"], k["body"], k["swizzle_panel"], fp8_promote_every=k["fp8_promote_every"],
            scratch=tuple(b.scratch), notes=tuple(b.notes[since:until]), loc=k["loc"]))
        since = until
    return ir.Function(name, tuple(kernels), b.kernels[0]["loc"])


def _returns(node: ast.AST) -> bool:
    """Whether ``node`` holds a ``return`` of the function it is in (a function defined inside
    it returns for itself: the frontend refuses that definition on its own terms)."""
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
        return False
    return isinstance(node, ast.Return) or any(_returns(n) for n in ast.iter_child_nodes(node))


class Macro:
    """``@T.macro``: a function of tile-language statements inlined where it is called from a
    kernel (or from another macro), its parameters bound to the call's arguments (buffers,
    scalars, Python values). Its body may end with ``return value``. ``cite_caller``: the
    statements it builds carry the caller's location (library intrinsics), not the macro's lines.
    """

    def __init__(self, fn: Callable, cite_caller: bool = False):
        self.fn = fn
        self.signature = inspect.signature(fn)
        self.cite_caller = cite_caller
        self._src: Optional[KernelSource] = None

    @property
    def src(self) -> KernelSource:
        """Parsed at the first call, so the names it sees include those defined after it."""
        if self._src is None:
            src = kernel_source(self.fn)
            for stmt in src.tree.body[:-1]:
                if _returns(stmt):
                    raise CompileError(f"T.macro '{src.name}' returns before the end of its body",
                                       ir.Loc(src.file, stmt.lineno + src.line_offset, 0))
            self._src = src
        return self._src

    def __call__(self, *args, **kwargs):
        from .context import builder
        b = builder()
        try:
            bound = self.signature.bind(*args, **kwargs)
        except TypeError as e:
            raise CompileError(f"T.macro '{self.src.name}': {e}", b.loc) from None
        bound.apply_defaults()
        v = KernelVisitor(b, self.src.names, self.src.line_offset, self.src.col_offset,
                          debug=b.debug, file=self.src.file, macro=True,
                          fixed_loc=b.loc if self.cite_caller else None)
        saved = b.loc
        for name, value in bound.arguments.items():
            v.bind(name, value)
        v.visit_body(self.src.tree.body)
        b.loc = saved
        return v.returned


def _param_value(name: str, spec: Any, v: KernelVisitor):
    if isinstance(spec, semantic.TensorSpec):
        ref = semantic.tensor_param(name, spec)
        for e in ref.buffer.shape:   # runtime dims are usable by name in the body
            if isinstance(e, ir.Var) and e.name not in v.local:
                v.bind(e.name, semantic.Scalar(e))
        return ref
    if isinstance(spec, ir.DType):
        return semantic.scalar_param(name, spec)
    return spec
