"""Walks a kernel function's Python AST and builds Tile IR.

Python-level values (shape parameters, dtypes, build-time lists) are evaluated as Python;
``T.*`` calls go to ``semantic``; ``with`` and ``for`` over tilews constructs become IR bodies;
``if`` on a runtime value becomes an IR ``If``. Every node visited sets the builder's location, and
any foreign exception is re-raised as a ``CompileError`` at the user's line
(``TILEWS_DEBUG_FRONTEND=1`` re-raises it raw).
"""
from __future__ import annotations

import ast
import builtins
import operator
from typing import Any, Optional

from .. import ir
from ..errors import CompileError, InternalError
from ..traverse import subexprs
from . import semantic, storage
from .context import Builder
from .values import BufferRef, ElementRef, NewVar, Scalar, VarRef, binary, compare, logical_not

_BINOPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
           ast.Div: operator.truediv, ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod,
           ast.BitAnd: operator.and_, ast.BitOr: operator.or_, ast.BitXor: operator.xor,
           ast.LShift: operator.lshift, ast.RShift: operator.rshift, ast.Pow: operator.pow}
_CMPS = {ast.Lt: operator.lt, ast.LtE: operator.le, ast.Gt: operator.gt, ast.GtE: operator.ge,
         ast.Eq: operator.eq, ast.NotEq: operator.ne, ast.Is: operator.is_,
         ast.IsNot: operator.is_not, ast.In: lambda a, b: a in b, ast.NotIn: lambda a, b: a not in b}
_RUNTIME_CMPS = {ast.Lt: ir.CmpKind.LT, ast.LtE: ir.CmpKind.LE, ast.Gt: ir.CmpKind.GT,
                 ast.GtE: ir.CmpKind.GE, ast.Eq: ir.CmpKind.EQ, ast.NotEq: ir.CmpKind.NE}


def _kernel_builtins() -> dict[str, Any]:
    """Builtins as seen inside a kernel: ``range`` is a serial loop, min/max work on runtime values."""
    loop = lambda *a: semantic.LoopFrame(ir.ForKind.SERIAL, *a)  # noqa: E731
    return {"range": loop,
            "max": lambda *a: semantic.math_call(ir.MathFn.MAX, *a) if len(a) > 1 else builtins.max(*a),
            "min": lambda *a: semantic.math_call(ir.MathFn.MIN, *a) if len(a) > 1 else builtins.min(*a),
            "abs": lambda x: semantic.math_call(ir.MathFn.ABS, x)}


def _is_allocation(value) -> bool:
    """A buffer or variable the kernel allocated (not a tensor parameter)."""
    return (isinstance(value, VarRef) or
            isinstance(value, BufferRef) and value.buffer.scope is not ir.Scope.GLOBAL)


KERNEL_SCOPE = "a T.Kernel block"   # where a name was bound (``KernelVisitor.scoped_out``)


class _Binding:
    __slots__ = ("value", "depth", "line")

    def __init__(self, value, depth: int, line: int):
        self.value, self.depth, self.line = value, depth, line


class KernelVisitor:
    """Visits one function body. ``names`` is the function's global + closure namespace."""

    def __init__(self, b: Builder, names: dict[str, Any], line_offset: int, col_offset: int = 0,
                 debug: bool = False, file: Optional[str] = None, fixed_loc: Optional[ir.Loc] = None,
                 macro: bool = False):
        """``file``: the visited function's file (default: the kernel's); ``fixed_loc``: every
        node built gets this location (a library macro's statements cite the user's call);
        ``macro``: the body may end with ``return value`` (``T.macro``)."""
        self.b = b
        self.names = names
        self.line_offset = line_offset
        self.col_offset = col_offset
        self.file = file or b.file
        self.fixed_loc = fixed_loc
        self.macro = macro
        self.returned: Any = None
        self.local: dict[str, _Binding] = {}
        # names bound inside a finished runtime body or T.Kernel block: (line, which of them)
        self.scoped_out: dict[str, tuple[int, str]] = {}
        self.depth = 0                         # nesting of runtime (IR) bodies
        self.kernel_builtins = _kernel_builtins()
        self.debug = debug

    # -- plumbing -------------------------------------------------------------------------------
    def _at(self, node: ast.AST) -> None:
        if self.fixed_loc is not None:
            self.b.loc = self.fixed_loc
        elif hasattr(node, "lineno"):
            self.b.loc = ir.Loc(self.file, node.lineno + self.line_offset,
                                node.col_offset + self.col_offset)

    def error(self, msg: str, notes=()) -> CompileError:
        return CompileError(msg, self.b.loc, notes)

    def visit_body(self, stmts: list[ast.stmt]) -> None:
        for s in stmts:
            self.visit_stmt(s)

    def visit_stmt(self, node: ast.stmt) -> None:
        self._at(node)
        method = getattr(self, f"stmt_{type(node).__name__}", None)
        if method is None:
            raise self.error(f"unsupported statement in a kernel: {type(node).__name__}")
        self._guard(method, node)

    def eval(self, node: ast.expr) -> Any:
        saved = self.b.loc
        self._at(node)
        method = getattr(self, f"expr_{type(node).__name__}", None)
        if method is None:
            raise self.error(f"unsupported expression in a kernel: {type(node).__name__}")
        out = self._guard(method, node)
        self.b.loc = saved
        return out

    def _guard(self, method, node):
        if self.debug:
            return method(node)
        try:
            return method(node)
        except (CompileError, InternalError):
            raise
        except Exception as e:  # a user's mistake surfacing as a Python error at this line
            raise CompileError(f"{type(e).__name__}: {e}", self.b.loc) from None

    # -- names ------------------------------------------------------------------------------------
    def lookup(self, name: str) -> Any:
        if name in self.local:
            return self.local[name].value
        if name in self.scoped_out:
            line, where = self.scoped_out[name]
            note = ("a kernel passes values to the kernels after it through T.alloc_global "
                    "buffers" if where == KERNEL_SCOPE else "values that change at run time live "
                    "in a T.alloc_var variable or a T.alloc_local buffer")
            raise self.error(f"'{name}' was assigned inside {where} (line {line}) and is not "
                             f"defined after it", [note])
        if name in self.names:
            return self.names[name]
        if name in self.kernel_builtins:
            return self.kernel_builtins[name]
        if hasattr(builtins, name):
            return getattr(builtins, name)
        raise self.error(f"name '{name}' is not defined")

    def bind(self, name: str, value: Any) -> None:
        old = self.local.get(name)
        # a name given a new buffer names it from here on, at build time (kernel-scoped)
        if old is not None and old.depth < self.depth and not _is_allocation(value):
            raise self.error(f"'{name}' (bound at line {old.line}) is reassigned inside a runtime "
                             f"loop or branch; a Python name cannot change at run time",
                             ["use a T.alloc_var variable (or a T.alloc_local buffer) for values that "
                              "change across iterations"])
        self.local[name] = _Binding(value, self.depth, self.b.loc.line)

    def runtime_body(self, stmts: list[ast.stmt]) -> list[ir.Stmt]:
        """Visit statements that form an IR body; names bound inside go out of scope after,
        except buffers allocated there (allocations are kernel-scoped, as in TileLang:
        ``semantic.alloc`` places them with the kernel body's)."""
        before = set(self.local)
        self.depth += 1
        try:
            with self.b.block() as body:
                self.visit_body(stmts)
        finally:
            self.depth -= 1
        self._scope_out(before)
        return body

    def _scope_out(self, before: set) -> None:
        """Unbind the names bound since ``before``, keeping allocated buffers (at this depth)."""
        for name in set(self.local) - before:
            binding = self.local[name]
            if _is_allocation(binding.value):
                binding.depth = self.depth
            else:
                self.scoped_out[name] = (self.local.pop(name).line, "a runtime loop or branch")

    def _kernel_scope_out(self, before: set) -> None:
        """Unbind the names a finished T.Kernel block bound (its block indices, on-chip buffers
        and values are its own, as in TileLang), except its T.alloc_global workspaces, which
        every kernel of the function sees."""
        for name in set(self.local) - before:
            value = self.local[name].value
            if not (isinstance(value, BufferRef) and value.buffer in self.b.scratch):
                self.scoped_out[name] = (self.local.pop(name).line, KERNEL_SCOPE)

    def assign(self, target: ast.expr, value: Any) -> None:
        if isinstance(target, ast.Name):
            old = self.local.get(target.id)
            if isinstance(value, NewVar):           # `v = T.alloc_var(...)` names the variable
                self.bind(target.id, VarRef(value.buffer))
            elif old is not None and isinstance(old.value, VarRef):
                semantic.store(old.value, value)    # assigning a variable's name stores into it
            else:
                self.bind(target.id, self._snapshot(target.id, value))
        elif isinstance(target, (ast.Tuple, ast.List)):
            vals = list(value) if not isinstance(value, Scalar) else None
            if vals is None or len(vals) != len(target.elts):
                raise self.error(f"cannot unpack {value!r} into {len(target.elts)} names")
            for t, v in zip(target.elts, vals):
                self.assign(t, v)
        elif isinstance(target, ast.Subscript):
            semantic.store(self.eval(target), value)
        else:
            raise self.error(f"cannot assign to {type(target).__name__}")

    def _snapshot(self, name: str, value: Any) -> Any:
        """A name binds a value, as TileLang's let-bindings do: a scalar expression (outside
        T.Parallel) that reads a local buffer, which later statements may change (``T.alloc_var``
        variables), is stored into a new hidden variable here and the name reads that one."""
        if not isinstance(value, Scalar) or self.b.kernel is None or self.b.parallel_vars:
            return value
        if not any(isinstance(e, ir.Load) and e.buffer.scope is ir.Scope.LOCAL
                   for e in subexprs(value.expr)):
            return value
        return Scalar(storage.alloc_var(value.dtype, value, "local.var", name).expr)

    # -- statements -------------------------------------------------------------------------------
    def stmt_Expr(self, node: ast.Expr) -> None:
        if isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
            return  # docstring
        self.eval(node.value)

    def stmt_Pass(self, node) -> None:
        pass

    def stmt_Assign(self, node: ast.Assign) -> None:
        hint = node.targets[0].id if len(node.targets) == 1 and isinstance(node.targets[0], ast.Name) else None
        self.b.name_hint = hint
        try:
            value = self.eval(node.value)
        finally:
            self.b.name_hint = None
        for t in node.targets:
            self.assign(t, value)

    def stmt_AnnAssign(self, node: ast.AnnAssign) -> None:
        if node.value is None:
            if self._eager_top_level() and isinstance(node.target, ast.Name) \
                    and node.target.id in self.b.eager.runtime:
                self.bind(node.target.id,
                          self.b.eager.declare(node.target.id, self.eval(node.annotation)))
                return
            raise self.error("annotated names without a value are not supported in kernels "
                             "(an eager function declares its parameters so, before T.Kernel)")
        self.b.name_hint = node.target.id if isinstance(node.target, ast.Name) else None
        try:
            value = self.eval(node.value)
        finally:
            self.b.name_hint = None
        self.assign(node.target, value)

    def stmt_AugAssign(self, node: ast.AugAssign) -> None:
        op = _BINOPS.get(type(node.op))
        if op is None:
            raise self.error(f"unsupported operator {type(node.op).__name__}")
        current = self.eval(node.target) if not isinstance(node.target, ast.Name) else self.lookup(node.target.id)
        self.assign(node.target, op(current, self.eval(node.value)))

    def stmt_Assert(self, node: ast.Assert) -> None:
        cond = self.eval(node.test)
        if isinstance(cond, Scalar):
            raise self.error("assert needs a condition known at build time")
        if not cond:
            msg = self.eval(node.msg) if node.msg is not None else ast.unparse(node.test)
            raise self.error(f"assertion failed: {msg}")

    def stmt_If(self, node: ast.If) -> None:
        cond = self.eval(node.test)
        if isinstance(cond, Scalar):
            loc = self.b.loc
            then = self.runtime_body(node.body)
            orelse = self.runtime_body(node.orelse)
            self.b.loc = loc
            semantic.emit_if(cond, then, orelse, loc)
        elif cond:
            self.visit_body(node.body)
        else:
            self.visit_body(node.orelse)

    def stmt_With(self, node: ast.With) -> None:
        if len(node.items) != 1:
            raise self.error("use one construct per `with` statement")
        item = node.items[0]
        frame = self.eval(item.context_expr)
        if not isinstance(frame, semantic.Frame):
            raise self.error(f"`with` takes a tilews construct (T.Kernel, T.ws), got {frame!r}")
        names = self._target_names(item.optional_vars) if item.optional_vars is not None else []
        loc = self.b.loc
        before = set(self.local)
        value = frame.enter(names)
        if item.optional_vars is not None:
            self.assign(item.optional_vars, value)
        is_kernel = isinstance(frame, semantic.KernelFrame)
        body = self._frame_body(node.body, bind_depth=not is_kernel)
        self.b.loc = loc
        frame.exit(body)
        if is_kernel:
            self._kernel_scope_out(before)

    def _frame_body(self, stmts, bind_depth: bool) -> list[ir.Stmt]:
        if bind_depth:
            return self.runtime_body(stmts)
        with self.b.block() as body:
            self.b.kernel_body = body
            self.visit_body(stmts)
        return body

    def stmt_For(self, node: ast.For) -> None:
        if node.orelse:
            raise self.error("for-else is not supported in kernels")
        it = self.eval(node.iter)
        if isinstance(it, semantic.Frame):
            names = self._target_names(node.target)
            loc = self.b.loc
            value = it.enter(names)
            before = set(self.local)
            self.depth += 1
            self.assign(node.target, value)
            self.depth -= 1
            body = self.runtime_body(node.body)
            self._scope_out(before)
            self.b.loc = loc
            it.exit(body)
            return
        if isinstance(it, Scalar):
            raise self.error("cannot iterate over a runtime value")
        try:
            items = list(it)
        except TypeError:
            raise self.error(f"cannot iterate over {it!r}") from None
        for v in items:  # build-time loop: unrolled into the program
            self.assign(node.target, v)
            self.visit_body(node.body)

    def _target_names(self, target: ast.expr) -> list:
        if isinstance(target, ast.Name):
            return [target.id]
        if isinstance(target, (ast.Tuple, ast.List)):
            return [t.id if isinstance(t, ast.Name) else None for t in target.elts]
        return [None]

    def _eager_top_level(self) -> bool:
        """At the top of an eager function's body, outside its T.Kernel blocks."""
        return (self.b.eager is not None and not self.macro and self.depth == 0
                and self.b.kernel_body is None)

    def stmt_Return(self, node) -> None:
        if self.b.eager is not None and not self.macro and self.depth == 0 and self.b.kernel is None:
            self.b.eager.record_return(None if node.value is None else self.eval(node.value))
            return
        if not self.macro:
            raise self.error("a kernel body cannot return a value; write results to output tensors")
        if self.depth:
            raise self.error("a T.macro returns only at the end of its body, not inside a runtime "
                             "loop or branch")
        self.returned = None if node.value is None else self.eval(node.value)

    # -- expressions ------------------------------------------------------------------------------
    def expr_Constant(self, node: ast.Constant):
        return node.value

    def expr_Name(self, node: ast.Name):
        return self.lookup(node.id)

    def expr_Attribute(self, node: ast.Attribute):
        return getattr(self.eval(node.value), node.attr)

    def expr_Subscript(self, node: ast.Subscript):
        return self.eval(node.value)[self.eval(node.slice)]

    def expr_Slice(self, node: ast.Slice):
        part = lambda n: None if n is None else self.eval(n)  # noqa: E731
        return slice(part(node.lower), part(node.upper), part(node.step))

    def expr_Tuple(self, node: ast.Tuple):
        return tuple(self._elts(node.elts))

    def expr_List(self, node: ast.List):
        return list(self._elts(node.elts))

    def expr_Dict(self, node: ast.Dict):
        out = {}
        for k, v in zip(node.keys, node.values):
            if k is None:                                  # {**other}
                out.update(self.eval(v))
            else:
                out[self.eval(k)] = self.eval(v)
        return out

    def _elts(self, elts):
        for e in elts:
            if isinstance(e, ast.Starred):
                yield from self.eval(e.value)
            else:
                yield self.eval(e)

    def expr_BinOp(self, node: ast.BinOp):
        op = _BINOPS.get(type(node.op))
        if op is None:
            raise self.error(f"unsupported operator {type(node.op).__name__}")
        return op(self.eval(node.left), self.eval(node.right))

    def expr_UnaryOp(self, node: ast.UnaryOp):
        v = self.eval(node.operand)
        if isinstance(node.op, ast.Not):
            return logical_not(v)
        return {ast.USub: operator.neg, ast.UAdd: operator.pos, ast.Invert: operator.invert}[type(node.op)](v)

    def expr_Compare(self, node: ast.Compare):
        left = self.eval(node.left)
        result = True
        for op, right_node in zip(node.ops, node.comparators):
            right = self.eval(right_node)
            if isinstance(left, Scalar) or isinstance(right, Scalar):
                kind = _RUNTIME_CMPS.get(type(op))
                if kind is None:
                    raise self.error(f"'{type(op).__name__}' cannot compare runtime values")
                part = compare(kind, left, right)
            else:
                part = _CMPS[type(op)](left, right)
            result = part if result is True else self._and(result, part)
            left = right
        return result

    def _and(self, a, b):
        if isinstance(a, Scalar) or isinstance(b, Scalar):
            return binary(ir.BinOpKind.LAND, a, b)
        return a and b

    def expr_BoolOp(self, node: ast.BoolOp):
        is_and = isinstance(node.op, ast.And)
        acc = self.eval(node.values[0])
        for v in node.values[1:]:
            if not isinstance(acc, Scalar):
                if (not acc) if is_and else acc:   # Python short-circuit
                    return acc
                acc = self.eval(v)
                continue
            acc = binary(ir.BinOpKind.LAND if is_and else ir.BinOpKind.LOR, acc, self.eval(v))
        return acc

    def expr_IfExp(self, node: ast.IfExp):
        cond = self.eval(node.test)
        if isinstance(cond, Scalar):
            return semantic.select(cond, self.eval(node.body), self.eval(node.orelse))
        return self.eval(node.body) if cond else self.eval(node.orelse)

    def expr_Call(self, node: ast.Call):
        fn = self.eval(node.func)
        args = list(self._elts(node.args))
        kwargs = {}
        for kw in node.keywords:
            if kw.arg is None:
                kwargs.update(self.eval(kw.value))
            else:
                kwargs[kw.arg] = self.eval(kw.value)
        return fn(*args, **kwargs)

    def expr_Lambda(self, node: ast.Lambda):
        """A build-time function of positional parameters; a call evaluates its body here, with
        the parameters bound (TileLang's ``T.comm_reducer(lambda x, y: x + y, ...)``)."""
        a = node.args
        if a.posonlyargs or a.vararg or a.kwonlyargs or a.kwarg or a.defaults:
            raise self.error("a lambda in a kernel takes plain positional parameters only")
        names = [p.arg for p in a.args]

        def call(*values):
            if len(values) != len(names):
                raise TypeError(f"the lambda takes {len(names)} arguments, got {len(values)}")
            saved = dict(self.local)
            try:
                for name, value in zip(names, values):
                    self.local[name] = _Binding(value, self.depth, self.b.loc.line)
                return self.eval(node.body)
            finally:
                self.local.clear()
                self.local.update(saved)
        return call

    # -- comprehensions: evaluated at build time, their names local to them as in Python --------
    def expr_ListComp(self, node: ast.ListComp):
        return [self.eval(node.elt) for _ in self._comprehension(node.generators)]

    def expr_GeneratorExp(self, node: ast.GeneratorExp):
        return iter(self.expr_ListComp(node))       # built eagerly: the names it reads may change

    def expr_SetComp(self, node: ast.SetComp):
        return set(self.expr_ListComp(node))

    def expr_DictComp(self, node: ast.DictComp):
        return {self.eval(node.key): self.eval(node.value) for _ in self._comprehension(node.generators)}

    def _comprehension(self, generators: list[ast.comprehension]):
        """Yield once per combination of the generators' items that passes their ``if``s, with
        the targets bound; the names bound before are restored after."""
        saved = dict(self.local)
        try:
            yield from self._generate(generators)
        finally:
            self.local.clear()
            self.local.update(saved)

    def _generate(self, generators: list[ast.comprehension]):
        if not generators:
            yield None
            return
        first, rest = generators[0], generators[1:]
        if first.is_async:
            raise self.error("async comprehensions are not supported in a kernel")
        for item in self.eval(first.iter):
            self._bind_comprehension_target(first.target, item)
            if all(self.eval(cond) for cond in first.ifs):
                yield from self._generate(rest)

    def _bind_comprehension_target(self, target: ast.expr, value: Any) -> None:
        if isinstance(target, ast.Name):
            self.local[target.id] = _Binding(value, self.depth, self.b.loc.line)
        elif isinstance(target, (ast.Tuple, ast.List)):
            values = list(value)
            if len(values) != len(target.elts):
                raise self.error(f"cannot unpack {value!r} into {len(target.elts)} names")
            for t, v in zip(target.elts, values):
                self._bind_comprehension_target(t, v)
        else:
            raise self.error(f"cannot bind a comprehension's item to {type(target).__name__}")

    def expr_JoinedStr(self, node: ast.JoinedStr):
        parts = []
        for v in node.values:
            if isinstance(v, ast.FormattedValue):
                parts.append(format(self.eval(v.value)))
            else:
                parts.append(v.value)
        return "".join(parts)


__all__ = ["KernelVisitor", "ElementRef"]
