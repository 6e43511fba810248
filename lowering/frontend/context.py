"""The build-time state of the kernel being built: statement lists, location, names.

One ``Builder`` is active per thread while the frontend walks a kernel; ``T.*`` functions reach it
through ``builder()``. Outside a kernel they get a plain error sentence.
"""
from __future__ import annotations

import sys
import threading
from contextlib import contextmanager
from typing import Optional

from .. import ir
from ..errors import CompileError

_state = threading.local()


class Builder:
    def __init__(self, name: str, file: str):
        self.name = name
        self.file = file
        self.loc = ir.Loc(file, 0, 0)
        self._stack: list[list[ir.Stmt]] = [[]]
        self._names: dict[str, int] = {}
        self.params: list = []
        self.kernel: Optional[dict] = None        # the open T.Kernel: grid, threads, block_vars
        self.kernel_body: Optional[list[ir.Stmt]] = None   # the T.Kernel body being built
        self.kernels: list[dict] = []             # the closed T.Kernel blocks, in order
        self.swizzle_panel = 0
        self.parallel_vars: list[ir.Var] = []     # innermost last
        self.roles: list[tuple[int, ...]] = []    # enclosing T.ws, innermost last
        self.mbarrier_list: Optional[ir.Buffer] = None
        self.name_hint: Optional[str] = None       # the name an allocation is being assigned to
        self.debug = False                          # TILEWS_DEBUG_FRONTEND: raw errors
        self.target = ""                            # the target's name, "" when not known
        self.fp8_promote_every = 0                  # see ir.Kernel.fp8_promote_every
        self.eager = None                           # frontend.eager.EagerState in an eager build
        self.scratch: list[ir.Buffer] = []          # T.alloc_global buffers (also in params)
        self.notes: list[str] = []                  # hints recorded, not applied (ir.Kernel.notes)
        self.register_requests: dict[tuple[int, ...], int] = {}   # T.set_max_nreg per T.ws role
        self.thread_shape: tuple[int, ...] = ()      # the open T.Kernel's threads, (x, y, z)
        self.thread_vars: dict[int, ir.Var] = {}    # its thread indices asked for, by dimension
        self.vectorized_loops: set[ir.Var] = set()  # index variables of T.vectorized loops
        self.reduce_scopes: list = []               # open T.attr(comm_reducer, "reduce_scope"), innermost last
        self.reducers: dict[ir.Buffer, ir.ReduceKind] = {}   # T.alloc_reducer buffers, their combiner
        self.imported_sources: list[str] = []       # T.import_source's text (frontend/extern.py)

    def open_kernel(self, grid: tuple, threads: int, block_vars: tuple,
                    thread_shape: tuple[int, ...] = ()) -> None:
        """Start a ``T.Kernel`` block."""
        self.kernel = {"grid": grid, "threads": threads, "block_vars": block_vars}
        self.thread_shape = thread_shape or (threads,)
        self.thread_vars = {}

    def close_kernel(self, body: ir.Seq, loc: ir.Loc) -> None:
        """End the open ``T.Kernel`` block with its ``body``; later statements are outside any
        kernel (Python code, ``T.alloc_global``, the next ``T.Kernel``), and what a kernel
        decides for itself starts afresh for the next one."""
        self.kernels.append({**self.kernel, "body": body, "loc": loc,
                             "swizzle_panel": self.swizzle_panel,
                             "fp8_promote_every": self.fp8_promote_every,
                             "notes_until": len(self.notes)})
        self.kernel = self.kernel_body = self.mbarrier_list = None
        self.swizzle_panel = self.fp8_promote_every = 0
        self.register_requests = {}

    def unique(self, name: str) -> str:
        n = self._names.get(name, 0)
        self._names[name] = n + 1
        return name if n == 0 else f"{name}_{n}"

    def emit(self, s: ir.Stmt) -> None:
        if self.kernel is None:
            raise CompileError("tile operations must be inside `with T.Kernel(...)`", self.loc)
        self._stack[-1].append(s)

    @contextmanager
    def block(self):
        """Collect the statements emitted inside into a fresh list, yielded to the caller."""
        self._stack.append([])
        body: list[ir.Stmt] = self._stack[-1]
        try:
            yield body
        finally:
            self._stack.pop()

    def top_level(self) -> list[ir.Stmt]:
        return self._stack[0]

    def hoist_alloc(self, s: ir.Alloc) -> None:
        """Place an allocation with the kernel body's allocations (before its loops), wherever
        the statement being built is nested."""
        body = self.kernel_body
        if self.kernel is None or body is None:
            raise CompileError("tile operations must be inside `with T.Kernel(...)`", self.loc)
        at = max((i + 1 for i, t in enumerate(body) if isinstance(t, ir.Alloc)), default=0)
        body.insert(at, s)

    def nested(self) -> bool:
        """Whether statements are being built inside a loop, branch or role of the kernel body."""
        return self.kernel_body is not None and self._stack[-1] is not self.kernel_body


def builder() -> Builder:
    b = getattr(_state, "builder", None)
    if b is None:
        raise CompileError("tilews language functions (T.*) can only be used inside a kernel "
                           "body being compiled by @tilews.jit / @T.prim_func")
    return b


def building() -> bool:
    """Whether a kernel is being built on this thread."""
    return getattr(_state, "builder", None) is not None


def current_loc() -> ir.Loc:
    b = getattr(_state, "builder", None)
    return b.loc if b is not None else ir.UNKNOWN_LOC


def user_loc() -> ir.Loc:
    """``current_loc()`` while a kernel is built; outside one (a ``T.Tensor`` annotation that
    Python evaluates when the factory runs) the line of the innermost caller outside tilews."""
    if building():
        return current_loc()
    frame = sys._getframe(1)
    while frame is not None and frame.f_globals.get("__name__", "").partition(".")[0] == "tilews":
        frame = frame.f_back
    if frame is None:
        return ir.UNKNOWN_LOC
    positions = list(frame.f_code.co_positions())[frame.f_lasti // 2]
    return ir.Loc(frame.f_code.co_filename, frame.f_lineno, positions[2] or 0)


@contextmanager
def active(b: Builder):
    prev = getattr(_state, "builder", None)
    _state.builder = b
    try:
        yield b
    finally:
        _state.builder = prev
