"""What the MSL emitter keeps while it writes one kernel: names, lines, the plans it spells, and the
``T.Parallel`` loop it is inside. The block's shape (its simdgroups and their width) comes from the
``FragmentStoragePlan``.

Names: a user's buffer or variable keeps its name unless MSL or the emitter needs it (keywords,
the ``tws_`` prefix of the emitter's own names), then it gets a suffix. The emitter's own locals
(``tws_tid``, ``tws_sg``, ``tws_lane``: thread, simdgroup and lane index) are fixed.
"""
from __future__ import annotations

import contextlib
import math
import re
from dataclasses import dataclass
from typing import Optional

from tilews.lowering import ir, simplify
from tilews.lowering.errors import InternalError
from tilews.lowering.plans import FragmentStoragePlan, StreamPlan

TID, SG, LANE = "tws_tid", "tws_sg", "tws_lane"

_RESERVED = set("""
alignas alignof and asm auto bool break case catch char class const constexpr continue decltype
default delete do double else enum explicit extern false float for friend goto if inline int long
mutable namespace new noexcept not nullptr operator or private protected public register return
short signed sizeof static struct switch template this throw true try typedef typeid typename union
unsigned using virtual void volatile while half bfloat uint uchar ushort ulong device constant
threadgroup thread kernel vertex fragment metal simd min max abs exp exp2 log log2 sqrt rsqrt
select as_type fabs floor ceil pow fmin fmax INFINITY NAN main
""".split())


def msl_type(dt: ir.DType, loc: ir.Loc) -> str:
    name = dt.record.msl
    if not name:
        raise InternalError(f"metal backend: {dt} has no Metal type (legalize_metal should have "
                            f"refused it)", loc)
    return name


@dataclass(frozen=True)
class ParallelFrame:
    vars: tuple[ir.Var, ...]
    extents: tuple[int, ...]
    slot: str           # the slot index of this thread's iteration (registers buffers' index;
                        # "" in a per-thread loop, which touches no registers buffer)
    staged: tuple = ()  # (matrix buffer name, its element staged in scratch) when the loop runs
                        # per simdgroup tile


class Ctx:
    def __init__(self, kernel: ir.Kernel):
        self.kernel = kernel
        self.storage: FragmentStoragePlan = kernel.plan(FragmentStoragePlan)
        self.wide = frozenset(kernel.plan(StreamPlan).wide_offsets)
        self.threads = kernel.threads
        self.simdgroups = self.storage.simdgroups
        self.lanes = self.storage.simd_width          # threads of one simdgroup
        self.lines: list[str] = []
        self.helpers: set[str] = set()      # header snippets the body needs
        self.par: Optional[ParallelFrame] = None
        self.nonneg: set[ir.Var] = simplify.never_negative(kernel)   # grows with loop indices
        self._depth = 1
        self._names: dict[str, str] = {}
        self._taken: set[str] = {TID, SG, LANE}
        self._counter = 0

    # -- names ---------------------------------------------------------------------------------
    def name(self, user: str) -> str:
        if user not in self._names:
            base = re.sub(r"\W", "_", user)
            base = base if base and not base[0].isdigit() else f"v_{base}"
            if base in _RESERVED or base.startswith("tws_"):
                base += "_"
            out, n = base, 0
            while out in self._taken:
                n += 1
                out = f"{base}_{n}"
            self._taken.add(out)
            self._names[user] = out
        return self._names[user]

    def fresh(self, prefix: str) -> str:
        while True:
            self._counter += 1
            out = f"tws_{prefix}{self._counter}"
            if out not in self._taken:
                self._taken.add(out)
                return out

    # -- lines ---------------------------------------------------------------------------------
    def line(self, text: str) -> None:
        self.lines.append("    " * self._depth + text)

    @contextlib.contextmanager
    def block(self, head: str = ""):
        """``head {`` ... ``}`` (a bare scope without ``head``)."""
        self.line(f"{head} {{" if head else "{")
        self._depth += 1
        try:
            yield
        finally:
            self._depth -= 1
            self.line("}")

    def origin(self, loc: ir.Loc) -> None:
        if loc.line > 0:
            self.line(f"// tilews: {loc.file.rsplit('/', 1)[-1]}:{loc.line}")

    @contextlib.contextmanager
    def parallel(self, frame: ParallelFrame):
        outer, self.par = self.par, frame
        try:
            yield
        finally:
            self.par = outer

    # -- storage -------------------------------------------------------------------------------
    def where(self, b: ir.Buffer) -> str:
        """"global", "shared" (a shared buffer or a fragment held in shared memory), "registers",
        "private", "replicated" or "matrix"."""
        if b.scope is ir.Scope.GLOBAL:
            return "global"
        if b.scope is ir.Scope.SHARED:
            return "shared"
        return self.storage.of(b.name)

    def private_size(self, b: ir.Buffer) -> int:
        """Elements of a private buffer each thread holds (those after the thread dims)."""
        return math.prod(b.static_shape[len(self.storage.thread_shape):])

    def slots(self, b: ir.Buffer) -> int:
        """Elements of a registers buffer each thread holds."""
        n = 1
        for d in b.static_shape:
            n *= d
        return -(-n // self.threads)
