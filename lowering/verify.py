"""Well-formedness of a kernel; runs after the frontend and after every pass.

Checks: every statement has a location; every variable is bound where it is used, and every
global buffer (a parameter, or a ``PointerView`` earlier in an enclosing statement list); in a
warp-specialized program, roles name existing warp groups and are pairwise disjoint, only
allocations, loops and branches stand outside roles, and fragment/local buffers belong to one role;
in a kernel with an ``AsyncPlan``, the asynchronous-MMA discipline (``verify_async``).
Violations a user can cause are ``CompileError`` at the offending line.
"""
from __future__ import annotations

from . import ir, verify_async
from .errors import CompileError
from .plans import AsyncPlan
from .roles import describe, role_sets
from .traverse import buffers_read, buffers_written, exprs_of, subexprs, substmts


def run(kernel: ir.Kernel) -> ir.Kernel:
    bound = {v for v in kernel.block_vars} | set(kernel.scalar_params) | set(kernel.buffer_params)
    for v, e in kernel.block_defs:
        _check_expr(e, bound, kernel.loc)
        bound.add(v)
    for p in kernel.buffer_params:
        for d in p.shape:
            _check_expr(d, bound, p.loc)
    for g in kernel.grid:
        _check_expr(g, bound, kernel.loc)
    _check_stmt(kernel.body, bound)
    _check_roles(kernel)
    if kernel.find_plan(AsyncPlan) is not None:
        verify_async.run(kernel)
    return kernel


def _check_expr(e: ir.Expr, bound: set, loc: ir.Loc) -> None:
    for x in subexprs(e):
        if isinstance(x, ir.Var) and x not in bound:
            raise CompileError(f"'{x.name}' is used outside the loop or kernel that defines it", loc)


def _check_stmt(s: ir.Stmt, bound: set) -> None:
    if isinstance(s, ir.Seq):
        for t in s.stmts:
            _check_stmt(t, bound)
        return
    loc = getattr(s, "loc", ir.UNKNOWN_LOC)
    if loc == ir.UNKNOWN_LOC or loc.line <= 0:
        raise CompileError(f"internal: {type(s).__name__} has no source location")
    for e in exprs_of(s):
        _check_expr(e, bound, loc)
    for buf in buffers_read(s) + buffers_written(s):
        if buf.scope is ir.Scope.GLOBAL and buf not in bound:
            raise CompileError(f"tensor '{buf.name}' is used outside the statements that follow "
                               f"its T.make_tensor in the same block (loop, branch or kernel body)", loc)
    if isinstance(s, ir.PointerView):
        bound.add(s.buffer)     # for the statements after it in this list
    inner = set(bound)
    if isinstance(s, ir.For):
        inner.add(s.var)
    elif isinstance(s, ir.Parallel):
        inner.update(s.vars)
    for body in substmts(s):
        _check_stmt(body, inner)


def _check_roles(kernel: ir.Kernel) -> None:
    roles = role_sets(kernel.body)
    if not roles:
        return
    first = _first_role(kernel.body)
    if kernel.threads % 128:
        raise CompileError(f"a kernel with T.ws roles needs threads to be a multiple of 128 (warp "
                           f"groups), got {kernel.threads}", kernel.loc)
    groups = kernel.threads // 128
    for r in roles:
        if max(r) >= groups:
            raise CompileError(f"{describe(r)} names warp group {max(r)}, but threads="
                               f"{kernel.threads} gives warp groups 0..{groups - 1}",
                               _role_loc(kernel.body, r))
    for i, a in enumerate(roles):
        for b in roles[i + 1:]:
            if set(a) & set(b):
                raise CompileError(f"roles {describe(a)} and {describe(b)} share warp group(s) "
                                   f"{sorted(set(a) & set(b))}; roles must be disjoint",
                                   _role_loc(kernel.body, b))
    _check_outside_roles(kernel.body, first)
    owner: dict[ir.Buffer, tuple] = {}
    for r in _roles(kernel.body):
        for s in _leaves(r.body):
            for buf in _buffers(s):
                if buf.scope not in (ir.Scope.FRAGMENT, ir.Scope.LOCAL):
                    continue
                prev = owner.setdefault(buf, r.warpgroups)
                if prev != r.warpgroups:
                    raise CompileError(f"{buf.scope.value} buffer '{buf.name}' is used by roles "
                                       f"{describe(prev)} and {describe(r.warpgroups)}; registers "
                                       f"belong to one role (share data through shared memory)",
                                       s.loc)


def _first_role(body: ir.Stmt):
    return next(iter(_roles(body)), None)


def _roles(s: ir.Stmt):
    if isinstance(s, ir.Role):
        yield s
        return
    if isinstance(s, ir.WarpSpecialize):
        yield from s.roles
        return
    for body in substmts(s):
        for t in body.stmts:
            yield from _roles(t)


def _role_loc(body: ir.Stmt, warpgroups) -> ir.Loc:
    return next(r.loc for r in _roles(body) if r.warpgroups == warpgroups)


def _check_outside_roles(s: ir.Stmt, first_role) -> None:
    if isinstance(s, (ir.Role, ir.WarpSpecialize)):
        return
    if isinstance(s, (ir.Seq, ir.For, ir.If)):
        for body in substmts(s):
            for t in body.stmts:
                _check_outside_roles(t, first_role)
        return
    if isinstance(s, ir.Alloc):
        return
    raise CompileError(f"in a kernel with T.ws roles every operation must be inside a `with "
                       f"T.ws(...)` block; this {type(s).__name__.lower()} is outside all roles",
                       s.loc, [f"the first role is at line {first_role.loc.line}"] if first_role else [])


def _leaves(s: ir.Stmt):
    if isinstance(s, ir.Seq) or substmts(s):
        for body in substmts(s):
            for t in body.stmts:
                yield from _leaves(t)
        if not isinstance(s, ir.Seq):
            yield s
    else:
        yield s


def _buffers(s: ir.Stmt):
    yield from buffers_read(s)
    yield from buffers_written(s)
