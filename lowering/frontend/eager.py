"""The eager style (TileLang's newer ``@jit``): one function that declares its own tensors.

::

    @tilews.jit
    def matmul(A, B, block_M, block_N, block_K, dtype=T.float16):
        M, N, K = T.const("M, N, K")
        A: T.Tensor((M, K), dtype)          # a bare annotation declares a runtime parameter
        B: T.Tensor((K, N), dtype)
        C = T.empty((M, N), dtype)          # an output, allocated by the call
        with T.Kernel(...):
            ...
        return C

Which parameters are runtime (passed to the kernel) is decided from the source alone: those with a
bare annotation in the body (or a tensor/scalar annotation in the signature). Every other
parameter is a build-time constant. ``T.const`` names are specialized values read from the call's
tensors, unless a keyword of that name gives them. Which dimension gives each is found by running
the declarations (``declared_shapes``: the body up to ``with T.Kernel``, once per set of build-time
constants) with every ``T.const`` name a symbol, so shapes built in local variables, under
conditionals or as expressions bind as written (``const_sources``): a name comes from the first
runtime parameter, in signature order, that has it as a whole dimension, else from the first
dimension that is ``scale * name + offset`` with integer ``scale`` and ``offset``.

``build_eager`` builds the IR for one set of constants and ``T.const`` values. The parameters of
the kernel a caller sees are the runtime parameters in signature order followed by the returned
``T.empty`` outputs in return order (``EagerKernel.user_params``).
"""
from __future__ import annotations

import ast
from dataclasses import dataclass, field
from typing import Any, Optional

from .. import ir
from ..errors import CompileError
from . import KernelSource, finish_function, semantic
from .context import Builder, active, builder, building
from .values import BufferRef, Scalar
from .visitor import KernelVisitor


def _is_call_to(node: ast.AST, name: str) -> bool:
    """``T.<name>(...)`` or ``<name>(...)``."""
    if not isinstance(node, ast.Call):
        return False
    f = node.func
    return (isinstance(f, ast.Attribute) and f.attr == name) or (isinstance(f, ast.Name) and f.id == name)


def is_eager(tree: ast.FunctionDef) -> bool:
    """The function is written in the eager style: its body (outside nested functions) declares
    a tensor with a bare annotation, or calls ``T.const``/``T.empty``."""
    for stmt in tree.body:
        if isinstance(stmt, ast.AnnAssign) and stmt.value is None:
            return True
        if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            continue
        if any(_is_call_to(n, "const") or _is_call_to(n, "empty") for n in ast.walk(stmt)):
            return True
    return False


def split_names(names: str) -> list[str]:
    """``"M, N K"`` -> ``["M", "N", "K"]`` (commas and/or blanks separate)."""
    if not isinstance(names, str):
        raise TypeError(f"T.const/T.dynamic take the names as one string, got {names!r}")
    out = names.replace(",", " ").split()
    bad = [n for n in out if not n.isidentifier()]
    if not out or bad:
        raise ValueError(f"T.const/T.dynamic: {bad or names!r} is not a list of identifiers")
    return out


@dataclass(frozen=True)
class EagerSignature:
    """What the source says about the parameters (see the module docstring)."""
    params: tuple[str, ...]                       # every parameter, in order
    runtime: tuple[str, ...]                      # passed to the kernel, in signature order
    consts: tuple[str, ...]                       # T.const names, in order of appearance
    outputs: tuple[str, ...]                      # the names the body returns, in order
    # name -> ConstSource, read from the annotations as written (whole dimensions named in the
    # annotation itself): used where running the declarations fails (``const_sources``)
    written_sources: dict = field(default_factory=dict)


def _shape_nodes(ann: ast.expr) -> Optional[list[ast.expr]]:
    """The dimension expressions of ``T.Tensor((d0, d1), dt)`` / ``T.Tensor[[d0, d1], dt]``."""
    if isinstance(ann, ast.Call) and ann.args:
        shape = ann.args[0]
    elif isinstance(ann, ast.Subscript) and isinstance(ann.slice, ast.Tuple) and ann.slice.elts:
        shape = ann.slice.elts[0]
    else:
        return None
    if isinstance(shape, (ast.Tuple, ast.List)):
        return list(shape.elts)
    return [shape]


@dataclass(frozen=True)
class ConstSource:
    """Where a ``T.const`` value comes from: dimension ``dim`` of runtime parameter ``param`` is
    ``scale * value + offset``."""
    param: str
    dim: int
    scale: int = 1
    offset: int = 0

    def value(self, size: int) -> Optional[int]:
        """The value a dimension of ``size`` gives, or None where no positive integer does."""
        q, r = divmod(size - self.offset, self.scale)
        return q if r == 0 and q > 0 else None

    def describe(self, name: str) -> str:
        term = name if self.scale == 1 else f"{self.scale} * {name}"
        term += f" + {self.offset}" if self.offset > 0 else f" - {-self.offset}" if self.offset else ""
        return f"dimension {self.dim} of '{self.param}' ({term})"


def signature(src: KernelSource) -> EagerSignature:
    tree = src.tree
    args = tree.args
    if args.vararg or args.kwarg or args.posonlyargs:
        raise CompileError("an eager @tilews.jit function takes plain parameters (no *args, "
                           "**kwargs or positional-only ones)",
                           ir.Loc(src.file, tree.lineno + src.line_offset, 0))
    params = [a.arg for a in args.args + args.kwonlyargs]
    declared: dict[str, ast.expr] = {}
    for a in args.args + args.kwonlyargs:
        ann = src.fn.__annotations__.get(a.arg)
        if isinstance(ann, (semantic.TensorSpec, ir.DType)):
            declared[a.arg] = a.annotation
    consts: list[str] = []
    for stmt in tree.body:
        if (isinstance(stmt, ast.AnnAssign) and stmt.value is None
                and isinstance(stmt.target, ast.Name) and stmt.target.id in params):
            declared.setdefault(stmt.target.id, stmt.annotation)
        for n in ast.walk(stmt):
            if _is_call_to(n, "const") and n.args and isinstance(n.args[0], ast.Constant):
                try:
                    consts += [c for c in split_names(n.args[0].value) if c not in consts]
                except (TypeError, ValueError) as e:
                    raise CompileError(str(e), ir.Loc(src.file, n.lineno + src.line_offset,
                                                      n.col_offset)) from None
    runtime = tuple(p for p in params if p in declared)
    sources: dict[str, ConstSource] = {}
    for p in runtime:
        for d, dim in enumerate(_shape_nodes(declared[p]) or ()):
            if isinstance(dim, ast.Name) and dim.id in consts:
                sources.setdefault(dim.id, ConstSource(p, d))
    return EagerSignature(tuple(params), runtime, tuple(consts), _returned_names(src), sources)


def _returned_names(src: KernelSource) -> tuple[str, ...]:
    """The names of ``return C`` / ``return C, D`` / ``return [C, D]`` at the end of the body."""
    last = src.tree.body[-1]
    if not isinstance(last, ast.Return) or last.value is None:
        return ()
    value = last.value
    elts = value.elts if isinstance(value, (ast.Tuple, ast.List)) else [value]
    if not all(isinstance(e, ast.Name) for e in elts):
        raise CompileError("an eager function ends with `return` of its T.empty outputs by name "
                           "(`return C` or `return C, D`)",
                           ir.Loc(src.file, last.lineno + src.line_offset, last.col_offset))
    return tuple(e.id for e in elts)


# ----------------------------------------------------------------------------------------------
# the build


@dataclass
class EagerState:
    """The eager function being built (``Builder.eager``)."""
    consts: dict[str, Any]        # T.const name -> its int (a symbol in ``declared_shapes``)
    runtime: tuple[str, ...]
    outputs: list[BufferRef] = field(default_factory=list)    # T.empty, in creation order
    returned: Optional[list] = None
    declared: dict[str, Any] = field(default_factory=dict)    # runtime parameter -> its value

    # what the visitor calls at an eager body's top level (through ``Builder.eager``, so the
    # visitor imports nothing of this module)
    def declare(self, name: str, annotation: Any) -> Any:
        """``name: annotation`` at the top of an eager body: the runtime parameter's value."""
        if isinstance(annotation, semantic.TensorSpec):
            value = semantic.tensor_param(name, annotation)
        elif isinstance(annotation, ir.DType):
            value = semantic.scalar_param(name, annotation)
        else:
            raise semantic.err(f"parameter '{name}' is declared with {annotation!r}; use "
                               f"T.Tensor(shape, dtype) or a scalar dtype (T.int32, ...)")
        self.declared[name] = value
        return value

    def record_return(self, value: Any) -> None:
        """``return C`` at the top of an eager body: the outputs it returns."""
        values = [] if value is None else list(value) if isinstance(value, (tuple, list)) else [value]
        outputs = [o.buffer for o in self.outputs]
        for v in values:
            if not isinstance(v, BufferRef) or v.buffer not in outputs:
                raise semantic.err(f"an eager function returns its T.empty outputs only; {v!r} is "
                                   f"not one")
        if len({v.buffer for v in values}) != len(values):
            raise semantic.err("an output is returned twice")
        self.returned = values


class _Undeclared:
    """A runtime parameter before its ``X: T.Tensor(...)`` line: any use is an error there."""

    def __init__(self, name: str):
        self._name = name

    def _fail(self, *_a, **_k):
        raise semantic.err(f"parameter '{self._name}' is used before its declaration (write "
                           f"`{self._name}: T.Tensor(shape, dtype)` first)")

    __getattr__ = __getitem__ = __call__ = _fail


def const(names: str, dtype=ir.DType.I32):
    """``T.const("M, N")``: the build-time values of the named dimensions for this call."""
    state = _state("T.const")
    if semantic.as_dtype(dtype) != ir.DType.I32:
        raise semantic.err("T.const supports int32 dimensions only")
    values = []
    for n in split_names(names):
        if n not in state.consts:
            raise semantic.err(f"T.const '{n}' is not among the names the function's T.const "
                               f"calls spell out as string literals (`T.const(\"{n}, ...\")`), so "
                               f"no call can give it a value")
        values.append(state.consts[n])
    return values[0] if len(values) == 1 else tuple(values)


def empty(*shape, dtype=ir.DType.F32):
    """``C = T.empty((M, N), dtype)``: an output the call allocates and returns."""
    state = _state("T.empty")
    b = builder()
    if b.kernel is not None:
        raise semantic.err("T.empty declares an output of the function; call it outside "
                           "`with T.Kernel(...)`")
    if shape and isinstance(shape[0], (tuple, list)):     # T.empty((M, N)[, dtype])
        if len(shape) > 2:
            raise semantic.err("T.empty takes (shape, dtype) or the dims then dtype=...")
        shape, dtype = shape[0], (shape[1] if len(shape) == 2 else dtype)
    if b.name_hint is None:
        raise semantic.err("assign T.empty to a name: `C = T.empty(shape, dtype)`")
    ref = semantic.tensor_param(b.name_hint, semantic.TensorSpec(tuple(shape),
                                                                 semantic.as_dtype(dtype)))
    state.outputs.append(ref)
    return ref


def _state(what: str) -> EagerState:
    state = builder().eager if building() else None
    if state is None:
        raise CompileError(f"{what} is valid only inside an eager @tilews.jit function (one "
                           f"that declares its tensors in its body)")
    return state


def _bind_parameters(v: KernelVisitor, src: KernelSource, constants: dict[str, Any],
                     sig: EagerSignature) -> None:
    """Bind every parameter in the visitor: build-time ones to their values, runtime ones to
    their declaration (signature annotations) or to ``_Undeclared`` until the body declares them."""
    state = v.b.eager
    v._at(src.tree)
    for a in src.tree.args.args + src.tree.args.kwonlyargs:
        v._at(a)
        if a.arg not in sig.runtime:
            v.bind(a.arg, constants[a.arg])
            continue
        ann = src.fn.__annotations__.get(a.arg)
        v.bind(a.arg, state.declare(a.arg, ann) if isinstance(ann, (semantic.TensorSpec, ir.DType))
               else _Undeclared(a.arg))


def _opens_kernel(stmt: ast.stmt) -> bool:
    """``with T.Kernel(...)`` (the end of an eager function's declarations)."""
    return isinstance(stmt, ast.With) and any(_is_call_to(i.context_expr, "Kernel") for i in stmt.items)


def declared_shapes(src: KernelSource, constants: dict[str, Any],
                    sig: EagerSignature) -> dict[str, tuple[ir.Expr, ...]]:
    """The shapes the runtime tensor parameters are declared with, each ``T.const`` name a
    symbol (an ``ir.Var`` of its name): the body runs up to its first top-level
    ``with T.Kernel``. Raises the ``CompileError`` of a declaration that needs a name's value."""
    symbols = {c: Scalar(ir.Var(c, ir.DType.I32, ir.VarKind.PARAM)) for c in sig.consts}
    b = Builder(src.name, src.file)
    b.eager = EagerState(symbols, sig.runtime)
    v = KernelVisitor(b, src.names, src.line_offset, src.col_offset)
    with active(b):
        _bind_parameters(v, src, constants, sig)
        for stmt in src.tree.body:
            if _opens_kernel(stmt):
                break
            v.visit_stmt(stmt)
    return {p: ref.buffer.shape for p, ref in b.eager.declared.items() if isinstance(ref, BufferRef)}


@dataclass(frozen=True)
class ConstSources:
    """``const_sources``'s answer: a ``ConstSource`` per name it found; ``failure``: why the
    declarations could not run with symbols (then ``sources`` are the written ones)."""
    sources: dict
    failure: str = ""


def const_sources(src: KernelSource, constants: dict[str, Any], sig: EagerSignature) -> ConstSources:
    """Where each ``T.const`` value comes from for these build-time ``constants``: whole
    dimensions first (runtime parameters in signature order), then dimensions affine in one name.
    Where the declarations need a name's value (``if M > 1024`` before the kernel), the names
    the annotations show as whole dimensions (``sig.written_sources``)."""
    if not sig.consts:
        return ConstSources({})
    try:
        shapes = declared_shapes(src, constants, sig)
    except CompileError as e:
        return ConstSources(dict(sig.written_sources), f"{e.message} (line {e.loc.line})"
                            if e.loc is not None else e.message)
    found: dict[str, ConstSource] = {}
    for p in sig.runtime:
        for d, dim in enumerate(shapes.get(p, ())):
            if isinstance(dim, ir.Var) and dim.name in sig.consts:
                found.setdefault(dim.name, ConstSource(p, d))
    for p in sig.runtime:
        for d, dim in enumerate(shapes.get(p, ())):
            term = _affine(dim, sig.consts)
            if term is not None and term[0] not in found:
                found[term[0]] = ConstSource(p, d, term[1], term[2])
    return ConstSources(found)


def _affine(e: ir.Expr, names: tuple[str, ...]) -> Optional[tuple[str, int, int]]:
    """``(name, scale, offset)`` where ``e`` is ``scale * name + offset`` (``scale > 0``) in
    exactly one of ``names``; None otherwise."""
    terms = _linear(e, names)
    if terms is None:
        return None
    used = [(n, c) for n, c in terms.items() if n is not None and c != 0]
    if len(used) != 1 or used[0][1] <= 0:
        return None
    return used[0][0], used[0][1], terms.get(None, 0)


def _linear(e: ir.Expr, names: tuple[str, ...]) -> Optional[dict]:
    """``e`` as integer coefficients by name (None: the constant term), or None where it is not
    a sum of integer multiples of ``names`` and integers."""
    if isinstance(e, ir.Const):
        return {None: e.value} if type(e.value) is int else None
    if isinstance(e, ir.Var):
        return {e.name: 1} if e.name in names and e.kind is ir.VarKind.PARAM else None
    if not isinstance(e, ir.BinOp) or e.op not in (ir.BinOpKind.ADD, ir.BinOpKind.SUB, ir.BinOpKind.MUL):
        return None
    a, b = _linear(e.a, names), _linear(e.b, names)
    if a is None or b is None:
        return None
    if e.op is ir.BinOpKind.MUL:
        if set(a) <= {None}:
            a, b = b, a
        if not set(b) <= {None}:
            return None
        k = b.get(None, 0)
        return {n: c * k for n, c in a.items()}
    sign = 1 if e.op is ir.BinOpKind.ADD else -1
    out = dict(a)
    for n, c in b.items():
        out[n] = out.get(n, 0) + sign * c
    return out


def build_eager(src: KernelSource, constants: dict[str, Any], consts: dict[str, int],
                sig: EagerSignature, *, debug: bool = False, target: str = "") -> ir.Function:
    """Build the IR of an eager function for one set of build-time ``constants`` (every
    non-runtime parameter) and ``consts`` (the T.const values). Its parameters are named as
    ``sig.runtime`` and ``sig.outputs`` say."""
    b = Builder(src.name, src.file)
    b.debug, b.target = debug, target
    b.eager = EagerState(dict(consts), sig.runtime)
    v = KernelVisitor(b, src.names, src.line_offset, src.col_offset, debug=debug)
    with active(b):
        _bind_parameters(v, src, constants, sig)
        v.visit_body(src.tree.body)
        state = b.eager
        v._at(src.tree)
        missing = [p for p in sig.runtime if p not in state.declared]
        if missing:
            raise v.error(f"parameter(s) {', '.join(missing)} are never declared in the body")
        returned = state.returned or []
        unreturned = [o.buffer.name for o in state.outputs
                      if o.buffer not in {r.buffer for r in returned}]
        if unreturned:
            raise v.error(f"the function must return every T.empty output; "
                          f"{', '.join(unreturned)} is not returned")
        if tuple(r.buffer.name for r in returned) != sig.outputs:
            raise v.error(f"the returned outputs ({', '.join(r.buffer.name for r in returned)}) "
                          f"are not the T.empty tensors of the same names")
        return finish_function(b, src.name)

